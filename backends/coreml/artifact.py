"""`lower`: write a Core ML artifact from the traced IR.

    artifact/
      model.mlpackage/          one ML program (iOS 18), two functions sharing their weights:
                                `prefill` (T flexible, 1..context) and `decode` (T = 1, static,
                                the default function); KV cache as state; fp16 compute
      tokenizer.json, tokenizer_config.json, chat_template.jinja, ...   beside the package
      coreml_checks.json        what was checked on this machine (verify.py) and what was not
      arkinfer.json             the manifest (written by the pipeline)

Options (`--option key=value`): `context` (tokens the KV state holds, a multiple of the block
size 64; default min(max_position_embeddings, 4096)), `compute` (fp16 | fp32; default fp16 for
quantised and f16 builds, fp32 for f32 builds), `compress` (none | linear8 | palettize4: a
`coremltools.optimize` pass over a *float* build's linears, coremltools' own quantiser).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from arkinfer.backend import LowerRequest, LowerResult
from arkinfer.errors import ArkError
from arkinfer.lowering.tokenizer_files import copy_tokenizer_files, tokenizer_dir
from arkinfer.lowering.versions import version

from .options import OPTIONS, context_option
from .runner import DEFERRED, PACKAGE
from .weights import SourceWeights

CHECKS_FILE = "coreml_checks.json"
COMPRESS = OPTIONS["compress"].choices


def options_of(request: LowerRequest, max_len: int) -> tuple[int, str, str]:
    """(context, compute dtype, compress) from the request's options, validated."""
    opts = dict(request.options or {})
    context = context_option(opts.pop("context", None), int(max_len))
    default = "fp32" if request.recipe is None and request.dtype == "f32" else "fp16"
    compute = opts.pop("compute", default)
    if compute not in OPTIONS["compute"].choices:
        raise ArkError(f"--option compute={compute!r}; allowed "
                       f"{', '.join(OPTIONS['compute'].choices)}",
                       hint="fp16 is what the Neural Engine runs")
    compress = opts.pop("compress", "none")
    if compress not in COMPRESS:
        raise ArkError(f"--option compress={compress!r}; allowed {', '.join(COMPRESS)}",
                       hint="compress applies to float builds (--quant f16)")
    if compress != "none" and request.recipe is not None:
        raise ArkError(f"--option compress={compress} re-quantises weights with coremltools; "
                       f"this build already carries {request.recipe.describe()} codes",
                       hint="use compress with --quant f16, or drop the option")
    if opts:
        raise ArkError(f"unknown coreml option(s) {sorted(opts)}",
                       hint=f"coreml options: {', '.join(OPTIONS)}")
    return context, compute, compress


def convert_function(program, src: SourceWeights, entry: str, context: int, compute: str,
                     out: Path):
    """Build, convert (iOS 18, no automatic fp16 pass: the program's dtypes are explicit) and
    save one function's package; returns the per-linear storage notes."""
    import coremltools as ct
    from coremltools.converters.mil.mil import Program

    from .program import build_function

    fn, layers = build_function(program, src, entry=entry, context=context, act=compute)
    prog = Program()
    prog.add_function("main", fn)
    inputs = None
    if entry == "prefill":
        import numpy as np

        inputs = [ct.TensorType(name="tokens", shape=(1, ct.RangeDim(1, context, 1)),
                                dtype=np.int32), ct.TensorType(name="start", shape=(1,),
                                                               dtype=np.int32)]
    model = ct.convert(prog, convert_to="mlprogram", inputs=inputs,
                       minimum_deployment_target=ct.target.iOS18,
                       compute_precision=ct.precision.FLOAT32, skip_model_load=True)
    _save_and_drop_temp(model, out)
    return layers


def _save_and_drop_temp(model, out: Path) -> None:
    """Save `model` at `out`, then delete the temporary .mlpackage coremltools made for it (it
    would otherwise stay in /tmp until the interpreter exits, or for ever if it is killed)."""
    model.save(str(out))
    temp = getattr(model, "package_path", None)
    if getattr(model, "is_temp_package", False) and temp and Path(temp) != out:
        shutil.rmtree(temp, ignore_errors=True)


def _compress(path: Path, how: str) -> str:
    """Apply coremltools.optimize to a saved float package in place; returns a note."""
    import coremltools as ct
    import coremltools.optimize as cto

    model = ct.models.MLModel(str(path), skip_model_load=True)
    if how == "linear8":
        cfg = cto.coreml.OptimizationConfig(global_config=cto.coreml.OpLinearQuantizerConfig(
            mode="linear_symmetric", dtype="int8", granularity="per_channel"))
        model = cto.coreml.linear_quantize_weights(model, cfg)
    else:
        cfg = cto.coreml.OptimizationConfig(global_config=cto.coreml.OpPalettizerConfig(
            nbits=4, mode="kmeans", granularity="per_tensor"))
        model = cto.coreml.palettize_weights(model, cfg)
    shutil.rmtree(path)
    _save_and_drop_temp(model, path)
    return (f"--option compress={how}: coremltools.optimize quantised the float weights itself "
            "(not ArkInfer's recipe; no canonical codes to check)")


def lower(request: LowerRequest) -> LowerResult:
    import coremltools as ct

    from arkinfer.lowering.program import program_of

    from .preflight import raise_unconverted
    from .program import unconverted_ops
    from .verify import run_checks

    out = Path(request.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    src = SourceWeights(request.model_dir)
    program = program_of(request, src.raw, entries=("prefill",))  # both functions build from it
    raise_unconverted(unconverted_ops(program))
    context, compute, compress = options_of(request, int(program.meta["max_len"]))
    notes, layers = [], {}
    with tempfile.TemporaryDirectory(prefix="arkinfer-coreml-") as tmp:
        desc = ct.utils.MultiFunctionDescriptor()
        for entry in ("prefill", "decode"):
            request.progress(f"converting the {entry} function to a Core ML program")
            path = Path(tmp) / f"{entry}.mlpackage"
            layers.update(convert_function(program, src, entry, context, compute, path))
            if compress != "none":
                note = _compress(path, compress)
                notes += [] if note in notes else [note]
            desc.add_function(str(path), src_function_name="main", target_function_name=entry)
        desc.default_function_name = "decode"
        request.progress("saving model.mlpackage (prefill + decode, shared weights)")
        ct.utils.save_multifunction(desc, str(out / PACKAGE))
    files = [PACKAGE]
    files += copy_tokenizer_files(tokenizer_dir(request.model_dir, request.source_dir), out)
    request.progress("checking the saved package (weights, op set, composites)")
    checks = run_checks(out / PACKAGE, src, program, quantised=compress == "none")
    (out / CHECKS_FILE).write_text(json.dumps(checks, indent=2) + "\n", encoding="utf-8")
    files.append(CHECKS_FILE)
    if not checks["passed"]:
        raise ArkError("the saved Core ML package failed its checks: " + "; ".join(
            checks["summary"]), hint=f"details in {CHECKS_FILE}; this is a bug in the coreml "
                                     "backend, please report it")
    notes += checks["summary"] + [DEFERRED]
    sparse = program.meta.get("sparse_config")
    ops = {"attention": ("InfLLM v2 as MIL ops (avg-pool compression, fp32 block scoring, "
                         "exact tie-break selection, gather of the selected KV blocks, attention; "
                         f"dense below dense_len={sparse.get('dense_len')})") if sparse else
           "dense causal GQA as MIL ops over the KV state (fp32 softmax)",
           "linear": ("constexpr_blockwise_shift_scale (canonical codes) + linear"
                      if src.format else "linear (float weights)"),
           "rms_norm": "MIL ops (fp32 statistics)", "rope": "MIL ops (fp32 angles from start)",
           "kv_cache": f"Core ML state, fp16 [1, Hkv, {context}, D] per layer and k / v",
           "compute": compute}
    toolchain = {"coremltools": version("coremltools") or "unknown", "minimum_deployment_target": "iOS18",
                 "runtime_parity": "deferred to macOS"}
    return LowerResult(files=files, ops=ops, toolchain=toolchain, notes=notes, layers=layers)
