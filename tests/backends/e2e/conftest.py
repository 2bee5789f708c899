"""Fixtures of the end-to-end suite: the tiny Llama it builds beside the demo, and the `numpy`
test backend registered the way a third party's backend is, by a distribution's entry point in
the `arkinfer.backends` group (here a `.dist-info` folder written into a temporary folder on
sys.path, what `pip install` of a package declaring the entry point leaves behind). Nothing in
arkinfer/ or backends/ knows the test backend."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from numpy_backend.backend import NAME

from arkinfer.frontend.demo import demo_model_path
from arkinfer.models.configs import tiny_config
from arkinfer.testing.synthetic import write_checkpoint

HERE = Path(__file__).parent
ENTRY_POINT = f"{NAME} = numpy_backend.backend:BACKEND"
TOKENIZER = ("tokenizer.json", "tokenizer_config.json")


def write_distribution(site: Path) -> Path:
    """`site/arkinfer_numpy_backend-0.dist-info`: the metadata an installed package declaring the
    test backend's entry point has."""
    info = site / "arkinfer_numpy_backend-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: arkinfer-numpy-backend\n"
                                   "Version: 0\n", encoding="utf-8")
    (info / "entry_points.txt").write_text(f"[arkinfer.backends]\n{ENTRY_POINT}\n",
                                           encoding="utf-8")
    return info


@pytest.fixture(scope="module")
def numpy_backend_installed(tmp_path_factory):
    """The test backend's distribution and package on sys.path for the module, removed after."""
    site = tmp_path_factory.mktemp("site")
    write_distribution(site)
    added = [str(site), str(HERE)]
    sys.path[:0] = added
    yield site
    for entry in added:
        sys.path.remove(entry)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    """A 2-layer Llama (random weights, 2048-token vocabulary) with the demo's tokenizer."""
    demo = demo_model_path()
    extra = {n: (demo / n).read_text(encoding="utf-8") for n in TOKENIZER}
    return write_checkpoint(tmp_path_factory.mktemp("tiny-llama"),
                            tiny_config("llama", vocab_size=2048), extra_files=extra)
