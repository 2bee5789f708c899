"""The gguf backend's `--option KEY=VALUE`s (README.md's type table explains them).

Declared here, below both readers: the backend object (backend.py, which checks them at plan
time) and the tensor plan (plan.py, which reads them lower-cased), so neither imports the other
for them.
"""

from __future__ import annotations

from arkinfer.backend import BackendOption

OPTIONS = {
    "embeddings": BackendOption("ggml type of token_embd / output; default q8_0 when quantised, "
                                "else the dtype", ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1"),
                                example="q8_0", ignore_case=True),
    "rtn": BackendOption("who rounds an RTN recipe: ggml's quantiser, the default, or "
                         "ArkInfer's folder", ("ggml", "folder"), ignore_case=True),
}
