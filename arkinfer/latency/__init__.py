"""Latency model: what a model costs per token (`ModelCost`) and how fast it runs on a target
(`predict`, the roofline of docs/targets.md). `host_target()` is the `host` profile filled with
this machine's measured numbers (`arkinfer doctor`).

    cost = ModelCost.from_config(raw_config, quant="marlin", headers=None)
    p = predict(cost, load_target("jetson-orin"), ctx=4096, prompt=512, attention="dense")
    p.decode_tok_s, p.prefill_tok_s, p.ttft_s, p.bound, p.as_dict()
"""

from arkinfer.latency.cost import ModelCost, TensorCost, resolve_quant
from arkinfer.resolve import FLOAT_SCHEMES
from arkinfer.latency.predict import (
    MemoryFit,
    Prediction,
    Step,
    predict,
    workspace_bytes,
)
from arkinfer.latency.storage import Storage, format_bytes, linear_storage


def host_target(measure_if_missing: bool = True, remeasure: bool = False):
    """The `host` Target with this machine's measured memory, bandwidth and compute."""
    from arkinfer.targets.host import host_target as _host_target

    return _host_target(measure_if_missing=measure_if_missing, remeasure=remeasure)


__all__ = ["FLOAT_SCHEMES", "MemoryFit", "ModelCost", "Prediction", "Step", "Storage",
           "TensorCost", "format_bytes", "host_target", "linear_storage", "predict",
           "resolve_quant", "workspace_bytes"]
