"""The tvm backend's `--option KEY=VALUE`s (artifact.py reads them; README.md explains each).

Declared here, below both readers: the backend object (backend.py, which checks them at plan
time) and the lowering (artifact.py), so neither imports the other for them.
"""

from __future__ import annotations

from arkinfer.backend import BackendOption

OPTIONS = {
    "devices": BackendOption("the OpenCL builds: adreno, mali, none or adreno,mali, the default",
                             example="adreno"),
    "float_weights": BackendOption("storage of the float matrices (embedding, lm_head): q8 "
                                   "(Q8_0 blocks, the default), f16 or f32", ("q8", "f16", "f32")),
    "decode_activations": BackendOption("how the host decode's 4-bit linears take activations; "
                                        "default int16", ("int16", "int8", "f32")),
}
