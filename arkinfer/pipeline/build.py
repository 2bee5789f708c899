"""`arkinfer build`: load -> trace -> quantise -> lower -> verify -> write, atomically.

    plan = resolve_plan("demo", target="host", quant="q4_0")
    result = build(plan)                  # BuildResult(path, manifest); VerifyError on a failed gate

The artifact is assembled in a hidden sibling folder `.NAME.building-PID` and renamed to
`plan.out` only after verification passed and the manifest (with the hash of every file) is
written, so an interrupted or failed build leaves no artifact behind; an existing artifact is
replaced atomically (`arkinfer.output_folder`). Calibration work goes to `.NAME.work-PID` and is
removed at the end (both hold ArkInfer's marker file until then). Leftovers of a killed build (whose PID is gone) are removed by the next build
of the same name.
"""

from __future__ import annotations

import hashlib
import json
import math
import signal
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from arkinfer import __version__
from arkinfer.backend import LowerRequest, get_backend
from arkinfer.errors import ArkError
from arkinfer.output_folder import (
    make_staging,
    remove_leftovers,
    remove_work_folder,
    replace_folder,
)
from arkinfer.targets.machine import machine_info

from . import manifest as mf
from .build_cost import (
    calibration_cost,
    check_calibration_memory,
    cost_line,
    measure_stage,
)
from .draft_artifact import DRAFT_DIR, artifact_draft, write_draft
from .plan import BuildPlan, check_artifact_output
from .verify import VerifyError, backend_fidelity, float_reference, verify_runner

STAGES = ("load", "trace", "quantise", "lower", "verify", "write")
WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".onnx", ".data", ".bin", ".npz")


class Reporter:
    """Progress callbacks; the CLI shows them, tests use this silent default."""

    def stage(self, name: str) -> None: ...

    def step(self, message: str) -> None: ...

    def blocks(self, done: int, total: int, seconds: float) -> None: ...

    def stage_done(self, name: str, seconds: float, summary: str = "") -> None: ...


@dataclass
class BuildResult:
    path: Path
    manifest: dict[str, Any]


@contextmanager
def _terminate_as_interrupt():
    """SIGTERM raises KeyboardInterrupt so `finally` blocks clean up like on Ctrl-C."""
    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    try:
        old = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def build(plan: BuildPlan, *, threshold_overrides: dict[str, float] | None = None,
          reporter: Reporter | None = None, force: bool = False,
          command: list[str] | None = None) -> BuildResult:
    rep = reporter or Reporter()
    out = plan.out
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_leftovers(out)
    staging = make_staging(out, "building")
    work = make_staging(out, "work")
    timings: dict[str, float] = {}
    try:
        with _terminate_as_interrupt():
            data = _run_stages(plan, staging, work, rep, timings, threshold_overrides)
            data["build"] = {"command": command or sys.argv, "stage_seconds": timings,
                             "machine": machine_info()}
            t0 = time.perf_counter()
            rep.stage("write")
            data["files"] = mf.file_hashes(staging, rep.step)
            mf.write_manifest(staging, data)
            if not data["verification"]["passed"]:
                failures = data["verification"]["failures"]
                hint = ("loosen the gate explicitly with --threshold KEY=VALUE (and say so where "
                        "the artifact is used), or pick a more precise --quant")
                if all(f.startswith("fidelity") for f in failures):
                    # the runtime against the reference on the same weights: no threshold to loosen
                    hint = ("the runtime disagrees with ArkInfer's reference model on the same "
                            "quantised weights (a runtime or lowering fault, not the quantisation)"
                            ": build for another --backend meanwhile, and report it with the "
                            "build output")
                raise VerifyError(f"verification failed for {plan.out.name}: "
                                  f"{'; '.join(failures)}", hint=hint)
            check_artifact_output(out, plan.source, force=force)  # it may have changed since
            replace_folder(staging, out)
            rep.stage_done("write", time.perf_counter() - t0, str(out))
            return BuildResult(out, data)
    finally:
        remove_work_folder(staging)  # gone already once it was swapped in
        remove_work_folder(work)


def _run_stages(plan: BuildPlan, staging: Path, work: Path, rep: Reporter,
                timings: dict[str, float], threshold_overrides) -> dict[str, Any]:
    from arkinfer.frontend.checkpoint import open_checkpoint

    def timed(name: str):
        rep.stage(name)
        timings[name] = -time.perf_counter()

    def done(name: str, summary: str = "") -> None:
        timings[name] = round(timings[name] + time.perf_counter(), 3)
        rep.stage_done(name, timings[name], summary)

    backend = get_backend(plan.backend)
    # ---------------------------------------------------------------- load
    timed("load")
    ckpt = open_checkpoint(plan.source)
    if ckpt.tokenizer is None:
        raise ArkError(f"{plan.source} has no tokenizer.json",
                       hint="an artifact needs the model's tokenizer: add tokenizer.json")
    source = _source_record(plan, rep)
    source["n_params"] = sum(math.prod(i.shape) for i in ckpt.weights.infos.values())
    done("load", f"{ckpt.config.num_hidden_layers} layers, {len(source['files'])} files hashed")
    # ---------------------------------------------------------------- trace
    timed("trace")
    program, op_counts = _trace(plan, backend)
    done("trace", f"{sum(op_counts.values())} nodes in {len(program.entries)} entry points"
         if program is not None else f"skipped: {plan.backend} lowers from the weights")
    # ---------------------------------------------------------------- quantise
    timed("quantise")
    # --report needs ArkInfer's own quantise stage (it measures the SNR on calibration data)
    in_lower = (plan.recipe is not None and not plan.calib.needed(plan.recipe)
                and backend.quantizes_in_lower(plan.recipe, plan.options))
    if in_lower:  # the runtime's own quantiser rounds the float source while lowering
        quant_record, model_dir = _quantised_in_lower(plan), plan.source
    else:
        quant_record, model_dir = _quantise(plan, ckpt, work, rep)
    cost = quant_record.get("calibration_cost")
    done("quantise", "float weights, nothing to do" if plan.recipe is None else
         f"done by {plan.backend}'s lower" if in_lower else
         f"{plan.recipe.describe()}, {quant_record.get('bits_per_weight') or '-'} bits/weight"
         + (f"; {cost_line(cost)}" if cost else ""))
    # ---------------------------------------------------------------- lower
    timed("lower")
    request = LowerRequest(model_dir=model_dir, source_dir=plan.source, recipe=plan.recipe,
                           dtype=plan.dtype, target=plan.target, out_dir=staging,
                           options=plan.options, progress=rep.step, program=program)
    lowered = backend.lower(request)
    remove_work_folder(work)  # the quantised folder is no longer needed
    draft = write_draft(plan.draft, plan.draft_vocab, ckpt, plan.calib.path, staging, rep.step)
    if in_lower:
        _fill_from_lower(quant_record, lowered)
    done("lower", f"{len(lowered.files)} files" + (
        f", {quant_record['bits_per_weight']} bits/weight" if in_lower else ""))
    # ---------------------------------------------------------------- verify
    timed("verify")
    partial = {"backend": {"name": plan.backend}, "quant": {"scheme": plan.quant}}
    runner = backend.load(staging, partial)
    reference = float_reference(plan.source, runner, rep.step)  # recorded once, used twice
    verification = verify_runner(
        runner, plan.source, plan.recipe, plan.dtype, threshold_overrides, rep.step, reference,
        draft_of=(lambda r: artifact_draft(staging, {"draft": draft}, r)) if draft else None)
    # The quantised weights alone against the float model (`fidelity.quantisation`), measured
    # only where it is another number than verify's: a backend with reference weights runs
    # them in its own runtime (llama.cpp, onnxruntime, ...), so verify's KL is quantisation plus
    # runtime error; the reference backend's runtime *is* the reference model over the
    # quantised folder, so the quantise stage's KL would be verify's KL again.
    fidelity = backend_fidelity(backend, staging, runner, rep.step,
                                reference=reference if plan.recipe is not None else None)
    del reference
    if fidelity is not None:
        verification["fidelity"] = fidelity
        if not fidelity["passed"]:
            verification["passed"] = False
            verification["failures"].append(fidelity["failure"])
    del runner
    done("verify", "passed" if verification["passed"] else
         "FAILED: " + "; ".join(verification["failures"]))
    weights = sum(p.stat().st_size for p in staging.rglob("*")
                  if p.is_file() and p.suffix in WEIGHT_SUFFIXES
                  and p.relative_to(staging).parts[0] != DRAFT_DIR)
    from arkinfer.frontend.summary import compressed_key_bytes, kv_bytes_per_token

    cfg = ckpt.config
    sparse = plan.raw_config.get("sparse_config")
    return {
        "schema_version": mf.SCHEMA_VERSION, "arkinfer_version": __version__,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "name": plan.out.name, "source": source,
        "tokenizer": _tokenizer_record(plan.source, cfg.vocab_size),
        "quant": quant_record,
        "ir": {"ops": dict(sorted(op_counts.items())),
               "entry_points": list(program.entries) if program is not None else [],
               "passes": list(backend.ir_passes) if program is not None else []},
        "backend": {"name": plan.backend, "ops": lowered.ops, "toolchain": lowered.toolchain,
                    "notes": list(dict.fromkeys([*plan.notes, *lowered.notes])), "layers": lowered.layers},
        "target": {"id": plan.target.id, "name": plan.target.name,
                   "profile_sha256": _sha_or_none(Path(plan.target.path)) if plan.target.path
                   else None, "codegen": plan.target.codegen.to_dict()},
        "memory": {"weights_bytes": weights, "kv_bytes_per_token": kv_bytes_per_token(cfg),
                   "compressed_key_bytes_per_token":
                   compressed_key_bytes(cfg, 65536) / 65536 if sparse else None},
        "prediction": predict_for(plan),
        "verification": verification,
        "draft": draft,
    }


def _trace(plan: BuildPlan, backend) -> tuple[Any, dict[str, int]]:
    """(program, IR op -> node count): the model traced once (fp32 types) and run through the
    backend's own passes, exactly what it lowers from (LowerRequest.program) and what the
    manifest's `ir` records. (None, {}) for a backend that lowers from the weights alone.
    Raises TargetError naming every op the backend does not declare (`Capabilities.ops`)."""
    if not backend.lowers_from_ir:
        return None, {}
    import torch

    from arkinfer import ir
    from arkinfer.lowering.program_ops import check_program_ops

    program = ir.trace(str(plan.source), dtype=torch.float32, shape_only=True)
    program = ir.run_passes(program, backend.ir_passes)
    # before quantise: an op the backend cannot lower fails here, not after calibration
    check_program_ops(program, plan.backend, backend.capabilities.ops)
    op_counts: dict[str, int] = {}
    for graph in program.entries.values():
        for node in graph.nodes:
            op_counts[str(node.op)] = op_counts.get(str(node.op), 0) + 1
    return program, op_counts


def _quantise(plan: BuildPlan, ckpt, work: Path, rep: Reporter) -> tuple[dict[str, Any], Path]:
    if plan.recipe is None:
        return {"scheme": plan.quant, "dtype": plan.dtype, "recipe": None, "calibration": None,
                "calibration_sha256": None, "bits_per_weight": None, "layers": {},
                "float_layers": []}, plan.source
    from dataclasses import asdict

    from arkinfer.quant.calib.stream import calibrate
    from arkinfer.quant.calib.weight_only import quantize_weight_only
    from arkinfer.quant.calib_data import calibration_of
    from arkinfer.quant.export import SUMMARY_NAME, export_folder
    from arkinfer.quant.recipe import static_passes_for

    c = plan.calib
    if c.needed(plan.recipe):
        data = calibration_of(ckpt, c.path, c.samples, c.seq_len, c.seed,
                              progress=rep.step)  # --calib self: the model writes its text
        rep.step(f"calibration {data.samples} x {data.seq_len} tokens")
        # GPTQ without desc_act (every preset): act-order over static groups, so g_idx stays
        # k // group_size and every runtime reads the result (GGUF blocks and Marlin have no
        # g_idx; onnxruntime's MatMulNBits, MLX and Core ML take none). Chosen on the
        # development texts over the natural column order (KL 0.16-0.31 against 0.22-0.37 for
        # the gptq layout at group 64; BENCHMARKS.md, "Quantisation quality").
        static = plan.recipe.calib in ("gptq", "pgptq") and not plan.recipe.desc_act
        options = {"act_order": True, "static_groups": True,
                   "static_passes": static_passes_for(plan.recipe.format)} if static else None
        cost = calibration_cost(plan.raw_config, plan.recipe, c.device, data.samples,
                                data.seq_len)
        check_calibration_memory(cost, c.device)
        with measure_stage() as measured:
            run = calibrate(ckpt, plan.recipe, data, work / "calib", options=options,
                            progress=rep.blocks, device=c.device)
        gpu_peaks = [b["gpu_peak_bytes"] for b in run.blocks if b.get("gpu_peak_bytes")]
        if gpu_peaks:  # on a GPU: the largest block's peak of allocated GPU memory
            measured["peak_gpu_bytes"] = max(gpu_peaks)
        cost["measured"] = measured
    else:  # RTN / ternary: tensor by tensor from the weights, no activations
        cost = None
        run = quantize_weight_only(ckpt, plan.recipe, work / "calib", progress=rep.blocks)
    folder = export_folder(run, work / "quantised")
    summary = json.loads((folder / SUMMARY_NAME).read_text(encoding="utf-8"))
    layers = {}
    for block in summary["blocks"]:
        for r in block["linears"]:
            layers[r["name"]] = {k: v for k, v in r.items() if k != "name"}
    recipe = asdict(plan.recipe)
    recipe["skip"] = list(recipe["skip"])
    return {"scheme": plan.quant, "dtype": plan.dtype, "recipe": recipe,
            "calibration": summary["calibration"],
            "calibration_sha256": summary["calibration_sha256"],
            "calibration_device": summary.get("calibration_device"),
            "bits_per_weight": summary["bits_per_weight"], "layers": layers,
            "float_layers": summary["float_linears"], "calibration_cost": cost}, folder


def _quantised_in_lower(plan: BuildPlan) -> dict[str, Any]:
    """The quant record of a recipe the backend rounds itself (`Backend.quantizes_in_lower`);
    bits and layers are filled in from the LowerResult."""
    from dataclasses import asdict

    recipe = asdict(plan.recipe)
    recipe["skip"] = list(recipe["skip"])
    return {"scheme": plan.quant, "dtype": plan.dtype, "recipe": recipe, "calibration": None,
            "calibration_sha256": None, "bits_per_weight": None, "layers": {},
            "float_layers": []}


def _fill_from_lower(record: dict[str, Any], lowered) -> None:
    """bits_per_weight, quantised_by and per-linear storage from what lower() wrote."""
    if lowered.quant is None:
        raise RuntimeError("the backend said it quantises in lower() but returned no quant figures")
    record["bits_per_weight"] = lowered.quant["bits_per_weight"]
    record["quantised_by"] = lowered.quant["quantised_by"]
    record["layers"] = {name: {"storage": kind} for name, kind in sorted(lowered.layers.items())}


def predict_for(plan: BuildPlan) -> dict[str, Any] | None:
    """The latency model's prediction for the plan's target (None if it has no numbers)."""
    try:
        from arkinfer.latency import ModelCost, predict
    except ImportError:
        return None
    target = plan.target
    if target.measured_at_runtime:
        from arkinfer.latency import host_target

        target = host_target(measure_if_missing=True)
    if target.bandwidth is None:
        return None
    cost = ModelCost.from_config(plan.raw_config,
                                 quant=plan.recipe if plan.recipe is not None else plan.quant)
    attention = ["dense", "sparse"] if plan.raw_config.get("sparse_config") else ["dense"]
    return {a: {str(ctx): predict(cost, target, ctx=ctx, prompt=512, attention=a).as_dict()
                for ctx in (4096, 32768, 131072)} for a in attention}


def _source_record(plan: BuildPlan, rep: Reporter) -> dict[str, Any]:
    files = mf.source_file_hashes(plan.source, rep.step)
    raw = plan.raw_config
    arch = (raw.get("architectures") or [raw.get("model_type", "?")])[0]
    return {"path": str(plan.source.resolve()), "model_type": str(raw.get("model_type", "?")),
            "architecture": arch, "sparse_config": raw.get("sparse_config"),
            "config_sha256": files.get("config.json") or mf.sha256_file(plan.source / "config.json"),
            "files": files}


def _tokenizer_record(folder: Path, vocab_size: int) -> dict[str, Any]:
    template = None
    tc = folder / "tokenizer_config.json"
    if tc.is_file():
        template = json.loads(tc.read_text(encoding="utf-8")).get("chat_template")
    if template is None and (folder / "chat_template.jinja").is_file():
        template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    if isinstance(template, list):
        template = json.dumps(template, sort_keys=True)
    return {"tokenizer_sha256": _sha_or_none(folder / "tokenizer.json"),
            "chat_template_sha256": hashlib.sha256(template.encode()).hexdigest()
            if template else None, "vocab_size": int(vocab_size)}


def _sha_or_none(path: Path) -> str | None:
    return mf.sha256_file(path) if path.is_file() else None

