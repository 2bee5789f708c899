"""`--option accuracy_level=4` on the onnx / tensorrt backends: stored in model.onnx's metadata,
used by every later load of the artifact (its logits are those of a runner asked for level 4
explicitly, and differ from level 0's), verify's fidelity gate relaxed to gguf's 0.95, the level
reported in bench rows, and a value outside 0 / 4 refused at plan time."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("onnxruntime", reason="pip install 'arkinfer[onnx]'")
onnx = pytest.importorskip("onnx")

from arkinfer.backend import LowerRequest, check_backend_options, get_backend
from arkinfer.errors import ArkError

BACKEND = get_backend("onnx")


@pytest.fixture(scope="module")
def int4_pair(tmp_path_factory) -> tuple[Path, Path]:
    """The same tiny 4-bit Llama lowered twice: without options and with accuracy_level=4."""
    from arkinfer.quant import QuantRecipe
    from arkinfer.quant.calib.stream import calibrate
    from arkinfer.quant.calib_data import calibration_from_ids
    from arkinfer.quant.export import export_folder

    from arkinfer.models.configs import tiny_config
    from arkinfer.testing.synthetic import write_checkpoint

    root = tmp_path_factory.mktemp("onnx-accuracy")
    src = write_checkpoint(root / "hf", tiny_config("llama", vocab_size=300))
    recipe = QuantRecipe("rtn", "gptq", 4, 32, sym=True)
    ids = torch.randint(3, 300, (2, 16), generator=torch.Generator().manual_seed(0))
    folder = export_folder(calibrate(src, recipe, calibration_from_ids(ids), root / "calib"),
                           root / "q")
    out = []
    for name, options in (("plain", {}), ("int8", {"accuracy_level": "4"})):
        BACKEND.lower(LowerRequest(model_dir=folder, source_dir=src, recipe=recipe, dtype="f32",
                                   target=None, out_dir=root / name, options=options))
        out.append(root / name)
    return out[0], out[1]


def _logits(runner, ids: list[int]) -> np.ndarray:
    runner.reset()
    steps = [runner.prefill(ids[:5]).numpy()]
    steps += [runner.decode(t).numpy() for t in ids[5:]]
    return np.stack(steps)


def test_stored_level_is_what_every_load_uses(int4_pair):
    from arkinfer.backends.onnx.host_graph import stored_accuracy_level
    from arkinfer.backends.onnx.runner import OnnxRunner

    plain, int8 = int4_pair
    assert stored_accuracy_level(plain / "model.onnx") is None
    assert stored_accuracy_level(int8 / "model.onnx") == 4
    ids = torch.randint(3, 300, (12,), generator=torch.Generator().manual_seed(5)).tolist()

    loaded = BACKEND.load(int8)  # no level given: the artifact's
    assert loaded.accuracy_level == 4 and loaded.settings == {"accuracy_level": 4}
    assert loaded.fidelity_top1 == 0.95
    asked = OnnxRunner(plain, accuracy_level=4, cache=False)  # the same graph, level 4 asked
    np.testing.assert_array_equal(_logits(loaded, ids), _logits(asked, ids))

    default = BACKEND.load(plain)
    assert default.accuracy_level == 0 and default.fidelity_top1 is None
    assert not np.array_equal(_logits(default, ids), _logits(asked, ids))
    # an explicit level still wins over the stored one
    assert OnnxRunner(int8, accuracy_level=0, cache=False).accuracy_level == 0
    # the tensorrt backend (same graph and runner) reads it too
    assert get_backend("tensorrt").load(int8).accuracy_level == 4


def test_bench_rows_record_the_runner_settings(int4_pair):
    from arkinfer.pipeline.bench import OUR_FIELDS, common_fields

    manifest = {"backend": {"name": "onnx"}, "name": "x", "source": {"architecture": "llama"},
                "memory": {"weights_bytes": 1}, "target": {"id": "host"},
                "quant": {"scheme": "gptq"}}
    row = common_fields(manifest, "cpu", BACKEND.load(int4_pair[1]))
    assert "runner_settings" in OUR_FIELDS and row["runner_settings"] == {"accuracy_level": 4}
    assert common_fields(manifest, "cpu")["runner_settings"] == {}


@pytest.mark.parametrize("backend", ["onnx", "tensorrt"])
def test_level_outside_the_choices_is_refused(backend):
    assert check_backend_options(get_backend(backend), ["accuracy_level=4"]) == \
        {"accuracy_level": "4"}
    with pytest.raises(ArkError) as e:
        check_backend_options(get_backend(backend), ["accuracy_level=2"])
    assert "accuracy_level" in str(e.value) and "2" in str(e.value)
