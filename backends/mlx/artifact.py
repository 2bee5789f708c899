"""`lower`: write an MLX artifact in mlx-lm's layout.

    artifact/
      config.json                          the HF config + mlx-lm's "quantization" (config.py)
      model.safetensors                    MLX tensors under HF names (tensors.py); above the
        or model-0000i-of-0000N.safetensors  shard limit (5 GiB, mlx-lm's; --option shard_mb=N)
      model.safetensors.index.json         weight_map + total_size (mlx-lm writes it always)
      tokenizer.json, tokenizer_config.json, chat_template.jinja, generation_config.json, ...
      arkinfer.json                        the manifest (written by the pipeline)

Shards are written one at a time (`mx.save_safetensors`, metadata {"format": "mlx"} like
mlx-lm's save_model), so peak memory is one shard, not the model.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from arkinfer.backend import LowerRequest, LowerResult
from arkinfer.frontend.checkpoint import open_checkpoint
from arkinfer.frontend.shard_writer import INDEX_NAME, honour_umask, shard_names
from arkinfer.latency.storage import dtype_of
from arkinfer.lowering.tokenizer_files import copy_tokenizer_files, tokenizer_dir
from arkinfer.lowering.versions import version

from .config import artifact_config
from .options import shard_bytes
from .preflight import preflight
from .tensors import TensorPlan, to_mx

CONFIG_FILE = "config.json"


class ShardWriter:
    """Collects mlx arrays into shards of at most `max_bytes` and saves each when full."""

    def __init__(self, out: Path, max_bytes: int) -> None:
        self.out, self.max_bytes = out, max_bytes
        self.current: dict[str, Any] = {}
        self.size = 0
        self.written: list[tuple[Path, list[str]]] = []
        self.total = 0

    def add(self, arrays: dict[str, Any]) -> None:
        import mlx.core as mx

        mx.eval(list(arrays.values()))
        nbytes = sum(int(a.nbytes) for a in arrays.values())
        if self.current and self.size + nbytes > self.max_bytes:
            self.flush()
        self.current.update(arrays)
        self.size += nbytes
        self.total += nbytes

    def flush(self) -> None:
        import mlx.core as mx

        if not self.current:
            return
        path = self.out / f".shard-{len(self.written)}.safetensors"
        mx.save_safetensors(str(path), self.current, metadata={"format": "mlx"})
        self.written.append((path, list(self.current)))
        self.current, self.size = {}, 0

    def finish(self) -> list[str]:
        """Rename the shards to mlx-lm's names, write the index; the file names."""
        self.flush()
        names = shard_names(len(self.written))
        weight_map = {}
        for (tmp, keys), name in zip(self.written, names, strict=True):
            tmp.rename(self.out / name)
            honour_umask(self.out / name)
            weight_map.update({k: name for k in keys})
        index = {"metadata": {"total_size": self.total},
                 "weight_map": dict(sorted(weight_map.items()))}
        (self.out / INDEX_NAME).write_text(json.dumps(index, indent=4) + "\n", encoding="utf-8")
        return [*names, INDEX_NAME]


def _ops(raw: dict[str, Any], quantization: dict[str, Any] | None) -> dict[str, str]:
    sparse = raw.get("sparse_config")
    scaling = raw.get("rope_scaling") or {}
    linear = (f"mx.quantized_matmul (affine {quantization['bits']}-bit g"
              f"{quantization['group_size']})" if quantization else "float matmul")
    return {"attention": (f"InfLLM v2 above dense_len={sparse.get('dense_len')} in ArkInfer's "
                          "MLX runtime; mlx-lm runs it dense") if sparse else "dense causal GQA",
            "linear": linear, "rms_norm": "mx.fast.rms_norm",
            "rope": str(scaling.get("rope_type", scaling.get("type", "default")))}


def lower(request: LowerRequest) -> LowerResult:
    """Write the artifact into `request.out_dir` (see the module docstring)."""
    from .tensors import mx_rtn, plan_tensors

    folder = open_checkpoint(request.model_dir, with_tokenizer=False)
    same = Path(request.source_dir).resolve() == Path(request.model_dir).resolve()
    source = folder if same else open_checkpoint(request.source_dir, with_tokenizer=False)
    recipe = request.recipe
    notes = preflight(source.raw_config, recipe, request.target, request.dtype)
    float_dtype = request.dtype if recipe is None else dtype_of(source.raw_config)
    plans, quantization = plan_tensors(folder, source, recipe, request.dtype, float_dtype,
                                       request.options)
    raw = source.raw_config
    untie = raw.get("model_type") == "minicpm" and bool(raw.get("tie_word_embeddings"))
    if untie:
        embed = "model.embed_tokens.weight"
        plans.append(TensorPlan("lm_head.weight", "float", float_dtype, lambda: {
            "lm_head.weight": to_mx(folder.weights.get(embed), float_dtype)}))
        if quantization is not None:
            quantization["lm_head"] = False
    out = Path(request.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    writer = ShardWriter(out, shard_bytes(request.options))
    for i, p in enumerate(plans):
        request.progress(f"tensor {i + 1}/{len(plans)} {p.name} ({p.storage})")
        writer.add(p.arrays())
    files = writer.finish()
    config = artifact_config(raw, quantization, float_dtype, untie_lm_head=untie)
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    files.append(CONFIG_FILE)
    files += copy_tokenizer_files(tokenizer_dir(request.model_dir, request.source_dir), out)
    quantised = [p for p in plans if p.kind == "quantised"]
    if quantised:
        notes.append(f"linear codes: {quantised[0].storage}; recipe "
                     f"{recipe.describe()}")
    kept = [p.name.removesuffix(".weight") for p in plans
            if p.kind == "float" and quantization and quantization.get(
                p.name.removesuffix(".weight")) is False]
    if kept:
        notes.append(f"linears kept in {float_dtype}: {', '.join(kept)} (config.json "
                     "quantization entries: false)")
    toolchain = {"mlx": version("mlx") or "unknown"}
    if version("mlx-lm"):
        toolchain["mlx-lm"] = version("mlx-lm")
    layers = {p.name.removesuffix(".weight"): p.storage for p in plans
              if p.kind == "quantised" or p.name.removesuffix(".weight") in kept}
    quant = None
    if mx_rtn(recipe, request.options) and same:   # quantised here, from the float source
        quant = {"bits_per_weight": _linear_bits(quantised, source),
                 "quantised_by": f"mx.quantize (mlx {toolchain['mlx']})"}
    return LowerResult(files=files, ops=_ops(raw, quantization), toolchain=toolchain,
                       notes=notes, layers=layers, quant=quant)


def _linear_bits(quantised: list[TensorPlan], source: Any) -> float:
    """Bits per weight of the quantised linears as written (codes, scales and biases);
    `source`: the float checkpoint they were rounded from."""
    elements = sum(math.prod(source.weights.shape(p.name)) for p in quantised)
    return round(8 * sum(p.nbytes for p in quantised) / max(elements, 1), 4)
