"""Where every tensor of an MLX artifact comes from, and its MLX arrays.

    plan = plan_tensors(folder, source, recipe, dtype, options)   # [TensorPlan], file order
    arrays = plan[i].arrays()                                    # {"...q_proj.weight": mx.array, ...}

Rules (README.md, "Tensors"):

| tensor | float build | quantised build |
|---|---|---|
| linear the recipe quantises, RTN (mlx4, mlx8) | the dtype | `mx.quantize` of the float source in fp16: the bytes `mlx_lm.convert --dtype float16 -q` writes (fp16 scales and biases, bias = group minimum). `--option rtn=folder`: ArkInfer's RTN codes as quantised (fp16 scale, bias fp16(-scale*zero)) |
| linear, calibrated (gptq, awq, pgptq codes) | - | the folder's codes, repacked by `quant/formats/mlx.py`: same codes, scale s, bias -z*s, **fp32** scales and biases so `mx.dequantize` is exactly the canonical s*(q-z) (`--option scales=f16` halves their bytes and rounds like mlx-lm does) |
| other tensors (embeddings, norms, skipped linears) | the dtype | the source checkpoint's dtype (config.json torch_dtype; what `arkinfer plan` sizes) |

The float source is read for RTN only; every other tensor comes from the quantised folder
(AWQ changes norm weights, so they must come from there).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from arkinfer.quant.formats import get_format
from arkinfer.quant.load import format_of

from arkinfer import models
from arkinfer.errors import ArkError
from arkinfer.frontend.checkpoint import Checkpoint

from .options import OPTIONS

SCALE_OPTIONS = {"f32": "float32", "f16": "float16"}  # `scales=` (declared in options.py)
RTN_OPTIONS = OPTIONS["rtn"].choices


def mx_dtype(name: str):
    """The mlx dtype of "f32", "f16", "bf16" (or "float32", "float16")."""
    import mlx.core as mx

    return {"f32": mx.float32, "float32": mx.float32, "f16": mx.float16,
            "float16": mx.float16, "bf16": mx.bfloat16}[name]


def to_mx(t: torch.Tensor, dtype: str):
    """A torch float tensor as an mlx array of `dtype` (through float32, exact for f16/bf16)."""
    import mlx.core as mx

    return mx.array(t.detach().to(torch.float32).numpy()).astype(mx_dtype(dtype))


@dataclass
class TensorPlan:
    """One checkpoint tensor (or one linear's tensors) of the artifact.

    name: the HF / mlx-lm name (`<linear>.weight` for a linear); kind: "float" or "quantised";
    storage: what the manifest's layer table says; produce: returns {name: mx.array}."""

    name: str
    kind: str
    storage: str
    produce: Callable[[], dict[str, Any]] = field(repr=False)
    nbytes: int = 0

    def arrays(self) -> dict[str, Any]:
        return self.produce()


def model_layout(raw_config: dict[str, Any]) -> tuple[dict[str, tuple[int, ...]], set[str]]:
    """(the reference model's checkpoint tensors -> shape, in module order, tied lm_head
    excluded; the names of its nn.Linear modules, e.g. `model.layers.0.mlp.up_proj`)."""
    config = models.parse_config(raw_config, "config.json")
    with torch.device("meta"):
        model = models.build_model(config)
    linears = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    return models.module_for(raw_config).expected_weights(model), linears


def _option(options: dict[str, str], key: str, allowed, default: str) -> str:
    value = options.get(key, default).lower()
    if value not in allowed:
        raise ArkError(f"--option {key}={value} is not an mlx backend choice "
                       f"(allowed {', '.join(allowed)})", hint=f"write --option {key}={default}")
    return value


def mx_rtn(recipe: Any, options: dict[str, str]) -> bool:
    """True when `mx.quantize` rounds the linears from the float source in lower: an RTN recipe
    in the mlx format with rtn=mlx (the default, mlx4 / mlx8). The build then writes no
    quantised folder (`Backend.quantizes_in_lower`): ArkInfer's own RTN of every linear would
    only be thrown away (an 8B model: ~2 hours of scale search on a 2-core CPU)."""
    return (recipe is not None and recipe.calib == "rtn" and recipe.format == "mlx"
            and _option(options, "rtn", RTN_OPTIONS, "mlx") == "mlx")


def plan_tensors(folder: Checkpoint, source: Checkpoint, recipe: Any, dtype: str,
                 float_dtype: str, options: dict[str, str]) -> tuple[list[TensorPlan], dict]:
    """Every artifact tensor with its producer, and the config's "quantization" dict (None for a
    float build). `dtype`: the float build's dtype; `float_dtype`: the dtype of unquantised
    tensors in a quantised build (the source's)."""
    import mlx.core as mx

    qcfg = folder.raw_config.get("quantization_config")
    fmt_name, params = format_of(qcfg) if isinstance(qcfg, dict) else (None, {})
    rounds_source = mx_rtn(recipe, options)            # mx.quantize of the float source
    in_lower = fmt_name is None and rounds_source      # `folder` is the float source itself
    if in_lower:
        fmt_name, params = "mlx", {"bits": recipe.bits, "group_size": recipe.group_size}
    scales = SCALE_OPTIONS[_option(options, "scales", SCALE_OPTIONS, "f32")]
    expected, linears = model_layout(folder.raw_config)
    keep = float_dtype if recipe is not None else dtype
    plans: list[TensorPlan] = []
    quantization: dict[str, Any] | None = None
    if recipe is not None:
        quantization = {"group_size": int(recipe.group_size), "bits": int(recipe.bits),
                        "mode": "affine"}
    mlx_fmt = get_format("mlx")

    for name, shape in expected.items():
        owner = name.removesuffix(".weight")
        is_linear = name.endswith(".weight") and owner in linears and len(shape) == 2
        packed = is_linear and fmt_name is not None and (
            not recipe.skips(owner) if in_lower else f"{owner}.scales" in folder.weights)
        if not packed:
            if is_linear and quantization is not None:
                quantization[owner] = False  # kept in float: mlx-lm must not quantise it
            plans.append(TensorPlan(name, "float", keep,
                                    lambda n=name: {n: to_mx(folder.weights.get(n), keep)}))
            continue
        out, inp = int(shape[0]), int(shape[1])
        bits, group = int(params["bits"]), int(params["group_size"])
        keys = [k for k in ("qweight", "qzeros", "scales", "g_idx", "weight", "biases")
                if f"{owner}.{k}" in folder.weights]

        def read(o=owner, ks=tuple(keys)) -> dict[str, np.ndarray]:
            return {k: folder.weights.get(f"{o}.{k}").numpy() for k in ks}

        stored = "float16"
        if fmt_name == "mlx" and rounds_source:
            storage = f"mlx affine {bits}-bit g{group} (mx.quantize, fp16 scales/biases)"

            def produce(n=name, o=owner, b=bits, g=group):
                w = to_mx(source.weights.get(n), "f16")
                q, s, bias = mx.quantize(w, group_size=g, bits=b)
                return {f"{o}.weight": q, f"{o}.scales": s, f"{o}.biases": bias}
        elif fmt_name == "mlx":
            storage = f"mlx affine {bits}-bit g{group} ({recipe.calib} codes as quantised, fp16)"

            def produce(o=owner, r=read):
                t = r()
                return {f"{o}.{k}": mx.array(t[k]) for k in ("weight", "scales", "biases")}
        elif fmt_name in ("gptq", "awq"):
            stored = scales
            storage = (f"mlx affine {bits}-bit g{group} ({recipe.calib} codes from {fmt_name}, "
                       f"{scales} scales/biases{', exact' if scales == 'float32' else ''})")

            def produce(o=owner, r=read, f=fmt_name, p=dict(params), shp=(out, inp)):
                qw = get_format(f).unpack(r(), shp[0], shp[1], **p)
                if qw.act_order:
                    raise ArkError(f"{o}: the {f} codes use act-order (a permuting g_idx), "
                                   "which MLX affine cannot store",
                                   hint="quantise with desc_act=False")
                t = mlx_fmt.pack(qw, scale_dtype=scales)
                return {f"{o}.{k}": mx.array(v) for k, v in t.items()}
        else:
            raise ArkError(f"{folder.path} is quantised in the {fmt_name!r} format, which the mlx "
                           "backend does not store", hint="quantise with --quant mlx4, mlx8, "
                           "gptq or awq")
        nbytes = mlx_fmt.nbytes(out, inp, bits=bits, group_size=group, sym=bool(recipe.sym),
                                scale_dtype=stored)
        plans.append(TensorPlan(name, "quantised", storage, produce, nbytes))
    return plans, quantization
