"""`lower`: write a TVM artifact (layout: README.md).

    artifact/
      tvm_module.json            entry points, argument order, params, cache layout, targets,
                                 schedules, file names (what a host app or T2's checks read)
      host/model.so              the module compiled for this machine (llvm): the Runner
      device/<variant>.tar       OpenCL kernels + aarch64-linux-android host code as object files
                                 (`export_library` to .tar: link it into the app with the NDK)
      kernels/<variant>.cl       the generated OpenCL C, one `// Function:` section per kernel
      params.safetensors         every weight in the module's layout (weights.py: q4 + float32)
      config.json, tokenizer.json, tokenizer_config.json, ...   from the source checkpoint

Options (`--option key=value`): devices=adreno,mali (default both; `none` for a host-only
artifact).
"""

from __future__ import annotations

import json
import shutil
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import torch
from arkinfer.quant.export import TOKENIZER_FILES

from arkinfer import ir
from arkinfer.backend import LowerRequest, LowerResult
from arkinfer.errors import ArkError
from arkinfer.frontend.shard_writer import honour_umask

from .compile import DEVICE_VARIANTS, Build, build
from .cpu_schedule import SCHEDULE_NOTE
from .weights import SourceWeights, program_params

MODULE_FILE = "tvm_module.json"
HOST_LIB = "host/model.so"
PARAMS_FILE = "params.safetensors"
SCHEMA = 1


FLOAT_WEIGHTS = {"f16": np.float16, "f32": np.float32}
OPTIONS = ("devices", "float_weights", "decode_activations")
DECODE_ACTIVATIONS = ("f32", "int8")   # the first is the default


def device_variants(options: dict[str, str]) -> tuple[str, ...]:
    value = options.get("devices", ",".join(DEVICE_VARIANTS))
    return () if value in ("", "none") else tuple(v.strip() for v in value.split(",") if v.strip())


def float_weights(options: dict[str, str]):
    """numpy dtype of the float weight matrices (embedding, float linears such as a tied
    lm_head): `--option float_weights=f16` (default, MLC-LLM's q4f16: half the bytes a decode
    step reads for the lm_head) or f32. Norm weights and RoPE tables stay float32."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ArkError(f"unknown tvm option(s) {unknown}; known: {', '.join(OPTIONS)}",
                       hint="e.g. --option devices=adreno --option float_weights=f32")
    value = options.get("float_weights", "f16")
    if value not in FLOAT_WEIGHTS:
        raise ArkError(f"--option float_weights={value!r}; allowed {', '.join(FLOAT_WEIGHTS)}",
                       hint="f16 halves the float matrices (default); f32 keeps them exact")
    return FLOAT_WEIGHTS[value]


def decode_int8(options: dict[str, str]) -> bool:
    """`--option decode_activations=f32|int8`: the host build's decode 4-bit linears take the
    activation in fp32 (default: every entry matches the reference within fp32 rounding, which
    verify's fidelity gate assumes) or rounded to int8 per 32 values (kernels_int8.py, llama.cpp's
    Q4_0 x Q8_0 arithmetic: ~1.8x faster decode on x86, decode top-1 vs the reference ~0.93 as
    llama.cpp's ~0.95). Device builds are fp32 either way."""
    value = options.get("decode_activations", DECODE_ACTIVATIONS[0])
    if value not in DECODE_ACTIVATIONS:
        raise ArkError(f"--option decode_activations={value!r}; allowed "
                       f"{', '.join(DECODE_ACTIVATIONS)}",
                       hint="f32 (default) keeps fp32 activations; int8 decodes ~1.8x faster "
                            "on x86 with llama.cpp's 8-bit activation rounding")
    return value == "int8"


def _program(request: LowerRequest, passes: tuple[str, ...]) -> Any:
    if request.program is not None:
        return request.program
    program = ir.trace(str(request.source_dir), dtype=torch.float32, shape_only=True)
    return ir.run_passes(program, passes)


def notes_for(variants: tuple[str, ...], decode_int8: bool = False) -> list[str]:
    """What is and is not verified on this machine (the manifest keeps them)."""
    notes = ["verified here: the host (llvm) build of the same Relax module, against ArkInfer's "
             "reference model (verify) and the IR interpreter (tests)"]
    if decode_int8:
        notes.append("host decode: the 4-bit linears take the activation rounded to int8 per 32 "
                     "values (--option decode_activations=int8, as llama.cpp's CPU path); "
                     "verify's fidelity runs prefill, which stays fp32; measure decode with "
                     "benchmarks/decode_agreement.py")
    if variants:
        notes.append(f"device builds ({', '.join(variants)}: OpenCL + aarch64-linux-android host) "
                     "are compiled here but not run on a phone: no Android device on this machine")
        notes.append("device kernels compute in fp32; fp16 kernels are not built (PoCL, the OpenCL "
                     "runtime the tests use, has no cl_khr_fp16, so fp16 could not be checked)")
    return notes


def write(b: Build, out: Path, source_dir: Path, layers: dict[str, str],
          decode_int8: bool = False) -> list[str]:
    """The artifact's files from a Build; returns their artifact-relative paths."""
    files = [HOST_LIB, PARAMS_FILE, MODULE_FILE]
    (out / "host").mkdir(parents=True, exist_ok=True)
    b.host_exec.export_library(str(out / HOST_LIB))
    from safetensors.numpy import save_file  # numpy: the q4 codes are uint32

    save_file({k: np.ascontiguousarray(v) for k, v in b.params.items()}, str(out / PARAMS_FILE))
    honour_umask(out / PARAMS_FILE)
    devices = {}
    for variant, exe in b.device_exec.items():
        (out / "device").mkdir(exist_ok=True)
        (out / "kernels").mkdir(exist_ok=True)
        tar, cl = f"device/{variant}.tar", f"kernels/{variant}.cl"
        exe.export_library(str(out / tar))
        (out / cl).write_text(b.opencl_source(variant), encoding="utf-8")
        devices[variant] = {"library": tar, "opencl_source": cl,
                            "target": json.loads(str(b.device_targets[variant])),
                            "kernels": b.opencl_source(variant).count("// Function:")}
        files += [tar, cl]
    info = {"schema": SCHEMA, **b.signature.to_json(),
            "host": {"library": HOST_LIB, "target": json.loads(str(b.host_target))},
            "devices": devices, "params_file": PARAMS_FILE,
            "decode_activations": "int8" if decode_int8 else "f32",
            "schedules": {"host": "relax CPU default pipeline + dlight with " + SCHEDULE_NOTE
                          + ("; decode's 4-bit linears with int8 activations (kernels_int8: "
                             "pmaddubsw / pmaddwd, one expression per row)" if decode_int8 else ""),
                          "adreno": "relax adreno default pipeline: dlight Reduction, "
                                    "GeneralReduction, Fallback",
                          "mali": "relax gpu_generic default pipeline: dlight Matmul, GEMV, "
                                  "Reduction, GeneralReduction, Fallback"},
            "layers": layers}
    (out / MODULE_FILE).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    for name in ("config.json", *TOKENIZER_FILES):
        if (source_dir / name).is_file() and not (out / name).exists():
            shutil.copy2(source_dir / name, out / name)
            files.append(name)
    return files


def lower(request: LowerRequest, passes: tuple[str, ...]) -> LowerResult:
    variants = device_variants(request.options)
    float_dtype = float_weights(request.options)
    int8 = decode_int8(request.options)
    program = _program(request, passes)
    request.progress(f"pack weights (q4 + {np.dtype(float_dtype).name} float matrices)")
    params, layers = program_params(program, SourceWeights(request.model_dir), float_dtype)
    request.progress(f"compile llvm + {', '.join(variants) or 'no device'}")
    b = build(program, params, devices=variants, decode_int8=int8)
    files = write(b, request.out_dir, Path(request.source_dir), layers, int8)
    return LowerResult(files=files, ops=dict(b.signature.ops),
                       toolchain={"apache-tvm": metadata.version("apache-tvm")},
                       notes=notes_for(variants, int8), layers=layers)
