"""backends/tensorrt/vllm_rules.py on hand-made folders: the per-linear shape rules it reports are
the registered formats' own (`shape_refusal`), not a second copy. The artifact's real folders
are checked in test_tensorrt_artifact.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from arkinfer.backends.tensorrt.vllm_rules import vllm_problems
from arkinfer.quant.formats import get_format

MARLIN_CONFIG = {"quant_method": "gptq", "checkpoint_format": "marlin", "is_marlin_format": True,
                 "bits": 4, "group_size": 128, "sym": True, "desc_act": False}
OWNER = "model.layers.0.mlp.up_proj"


def _marlin_folder(folder: Path, out: int, inp: int) -> Path:
    """config.json and one Marlin linear [out, inp] with the tensor shapes vLLM allocates."""
    folder.mkdir()
    config = {"torch_dtype": "float16", "quantization_config": MARLIN_CONFIG}
    (folder / "config.json").write_text(json.dumps(config))
    save_file({f"{OWNER}.B": np.zeros((inp // 16, out * 2), np.int32),
               f"{OWNER}.s": np.zeros((inp // 128, out), np.float16)},
              str(folder / "model.safetensors"))
    return folder


def test_well_shaped_marlin_linear_passes(tmp_path):
    assert vllm_problems(_marlin_folder(tmp_path / "ok", 64, 256)) == []


@pytest.mark.parametrize("out, inp, why", [
    (96, 256, "out_features=96 is not a multiple of 64"),
    (64, 144, "group_size=128 does not divide in_features=144"),
], ids=["out%64", "in%group"])
def test_marlin_tile_rules_are_the_formats(tmp_path, out, inp, why):
    assert get_format("marlin").shape_refusal(out, inp, bits=4, group_size=128) == why
    problems = vllm_problems(_marlin_folder(tmp_path / "m", out, inp))
    assert problems == [f"{OWNER}: {why} (vLLM's marlin loader)"]
