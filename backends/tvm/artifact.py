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
from pathlib import Path

import numpy as np

from arkinfer.backend import LowerRequest, LowerResult
from arkinfer.errors import ArkError
from arkinfer.frontend.shard_writer import honour_umask
from arkinfer.lowering.program import program_of
from arkinfer.lowering.tokenizer_files import TOKENIZER_FILES, copy_tokenizer_files
from arkinfer.lowering.versions import version

from .compile import DEVICE_VARIANTS, Build, build
from .cpu_schedule import SCHEDULE_NOTE
from .options import OPTIONS
from .weights import Q8, SourceWeights, program_params

MODULE_FILE = "tvm_module.json"
HOST_LIB = "host/model.so"
PARAMS_FILE = "params.safetensors"
SCHEMA = 1


FLOAT_WEIGHTS = {"q8": Q8, "f16": np.float16, "f32": np.float32}  # `float_weights=`; first: default
DECODE_ACTIVATIONS = OPTIONS["decode_activations"].choices   # the first is the default
DECODE_SCHEDULES = {   # the host schedule note of each, for tvm_module.json
    "int16": "; decode's 4-bit linears with int16 activations (kernels_qact: pmovzxbw / pmaddwd, "
             "one expression per row; a Q8_0 lm_head: pmovsxbw / pmaddwd)",
    "int8": "; decode's 4-bit linears with int8 activations (kernels_qact: pmaddubsw / pmaddwd, "
            "one expression per row; a Q8_0 lm_head: pmovsxbw / pmaddwd)",
    "f32": "; decode's 4-bit linears in fp32 with the scales outside the sum (kernels_gemv: "
           "pmovzxbd / cvtdq2ps / FMA, one expression per row)"}


def device_variants(options: dict[str, str]) -> tuple[str, ...]:
    """`--option devices=adreno,mali|adreno|mali|none`: the OpenCL builds to make."""
    value = options.get("devices", ",".join(DEVICE_VARIANTS))
    variants = () if value in ("", "none") else \
        tuple(v.strip() for v in value.split(",") if v.strip())
    unknown = [v for v in variants if v not in DEVICE_VARIANTS]
    if unknown:
        raise ArkError(f"--option devices={value!r}: unknown tvm device variant {unknown[0]!r}; "
                       f"known: {', '.join(DEVICE_VARIANTS)}, none",
                       hint="pass --option devices=adreno,mali (a subset) or devices=none")
    return variants


def float_weights(options: dict[str, str]):
    """How the float weight matrices (embedding, float linears such as a tied lm_head) are
    stored: `--option float_weights=q8` (default: llama.cpp's Q8_0, blocks of 32 int8 with an
    fp16 scale, as llama.cpp's Q4_0 files keep their tied output; a quarter of fp32's bytes
    for the lm_head a decode step reads), f16 (MLC-LLM's q4f16) or f32 (exact). weights.Q8 or
    a numpy dtype. Norm weights and RoPE tables stay float32."""
    value = options.get("float_weights", next(iter(FLOAT_WEIGHTS)))
    if value not in FLOAT_WEIGHTS:
        raise ArkError(f"--option float_weights={value!r}; allowed {', '.join(FLOAT_WEIGHTS)}",
                       hint="q8 stores them as Q8_0 (default, fastest decode); f16 halves them; "
                            "f32 keeps them exact")
    return FLOAT_WEIGHTS[value]


def decode_activations(options: dict[str, str]) -> str:
    """`--option decode_activations=int16|int8|f32`: how the host build's decode 4-bit linears
    take the activation (lower_relax.HostDecode). int16 (default): rounded to int16 per 32
    values (kernels_qact.py; 1 part in 65534 of the block's largest value, finer than fp16),
    integer SIMD, ~1.7x the fp32 kernel's speed on x86. int8: llama.cpp's Q4_0 x Q8_0 rounding,
    ~2.2x, with llama.cpp's loss of decode agreement. f32: fp32 activations (kernels_gemv.py).
    Prefill and the device builds are fp32 either way. Decode top-1 vs the reference for each:
    benchmarks/decode_agreement.py."""
    value = options.get("decode_activations", DECODE_ACTIVATIONS[0])
    if value not in DECODE_ACTIVATIONS:
        raise ArkError(f"--option decode_activations={value!r}; allowed "
                       f"{', '.join(DECODE_ACTIVATIONS)}",
                       hint="int16 (default) matches fp32 decode to ~1e-5; int8 decodes faster "
                            "with llama.cpp's 8-bit activation rounding; f32 keeps fp32")
    return value


def notes_for(variants: tuple[str, ...], activations: str = DECODE_ACTIVATIONS[0]) -> list[str]:
    """What is and is not verified on this machine (the manifest keeps them)."""
    notes = ["verified here: the host (llvm) build of the same Relax module, against ArkInfer's "
             "reference model (verify) and the IR interpreter (tests)"]
    if activations != "f32":
        notes.append(f"host decode: the 4-bit linears take the activation rounded to "
                     f"{activations} per 32 values (--option decode_activations={activations}); "
                     "prefill stays fp32 (what verify's fidelity gate runs); decode top-1 vs the "
                     "reference: benchmarks/decode_agreement.py")
    if variants:
        notes.append(f"device builds ({', '.join(variants)}: OpenCL + aarch64-linux-android host) "
                     "are compiled here but not run on a phone: no Android device on this machine")
        notes.append("device kernels compute in fp32; fp16 kernels are not built (PoCL, the OpenCL "
                     "runtime the tests use, has no cl_khr_fp16, so fp16 could not be checked)")
    return notes


def write(b: Build, out: Path, source_dir: Path, layers: dict[str, str],
          activations: str = DECODE_ACTIVATIONS[0]) -> list[str]:
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
            "decode_activations": activations,
            "schedules": {"host": "relax CPU default pipeline + dlight with " + SCHEDULE_NOTE
                          + DECODE_SCHEDULES[activations],
                          "adreno": "relax adreno default pipeline: dlight Reduction, "
                                    "GeneralReduction, Fallback",
                          "mali": "relax gpu_generic default pipeline: dlight Matmul, GEMV, "
                                  "Reduction, GeneralReduction, Fallback"},
            "layers": layers}
    (out / MODULE_FILE).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return files + copy_tokenizer_files(source_dir, out, ("config.json", *TOKENIZER_FILES))


def lower(request: LowerRequest, passes: tuple[str, ...]) -> LowerResult:
    variants = device_variants(request.options)
    float_dtype = float_weights(request.options)
    activations = decode_activations(request.options)
    program = program_of(request, str(request.source_dir), passes=passes)
    kind = float_dtype if isinstance(float_dtype, str) else np.dtype(float_dtype).name
    request.progress(f"pack weights (q4 + {kind} float matrices)")
    params, layers = program_params(program, SourceWeights(request.model_dir), float_dtype)
    request.progress(f"compile llvm + {', '.join(variants) or 'no device'}")
    b = build(program, params, devices=variants, decode_activations=activations)
    files = write(b, request.out_dir, Path(request.source_dir), layers, activations)
    return LowerResult(files=files, ops=dict(b.signature.ops),
                       toolchain={"apache-tvm": version("apache-tvm") or "unknown"},
                       notes=notes_for(variants, activations), layers=layers)
