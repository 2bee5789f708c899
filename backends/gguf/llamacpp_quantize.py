"""llama.cpp's own quantiser (`llama_model_quantize`, what `llama-quantize` runs), as a function.

ArkInfer's GGUF files are compared with it: the same float GGUF quantised by llama.cpp is the
baseline for quality (benchmarks/gguf_quality.py) and for byte-exactness of RTN blocks.

    llamacpp_quantize("model-f16.gguf", "model-q4_0.gguf", "Q4_0")
"""

from __future__ import annotations

from pathlib import Path

from arkinfer.errors import ArkError

from .runner import load_llama_cpp

# llama.cpp's llama_ftype values (include/llama.h): the file types ArkInfer compares with,
# K-quants and i-quants included (the mixes a user picks instead of ArkInfer's recipes).
FTYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q4_K_S": 14, "Q4_K_M": 15,
          "Q5_K_S": 16, "Q5_K_M": 17, "Q6_K": 18, "IQ4_NL": 25, "IQ4_XS": 30, "BF16": 32,
          "TQ1_0": 36, "TQ2_0": 37}


def llamacpp_quantize(src: str | Path, dst: str | Path, ftype: str, *, pure: bool = False,
                      nthread: int = 0) -> Path:
    """Quantise the GGUF `src` to `dst` with llama.cpp's default per-tensor rules for `ftype`
    (e.g. output.weight in Q6_K / Q8_0); `pure=True` puts every tensor in `ftype`."""
    llama_cpp = load_llama_cpp()
    if ftype not in FTYPES:
        raise ArkError(f"llama.cpp file type {ftype!r} is not one ArkInfer compares with",
                       hint=f"use one of {', '.join(FTYPES)}")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[ftype]
    params.nthread = nthread
    params.pure = pure
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params)
    if rc != 0:
        raise ArkError(f"llama.cpp could not quantise {src} to {ftype} (return code {rc})",
                       hint="check that the input is a float GGUF llama.cpp loads")
    return Path(dst)
