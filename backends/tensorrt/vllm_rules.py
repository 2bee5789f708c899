"""What vLLM's loaders require of a quantised Hugging Face folder, as checks (the `hf/` folder of a
tensorrt artifact must pass them so a Jetson user can serve it with vLLM / SGLang).

Sources (vllm-project/vllm, vllm/model_executor/layers/quantization/):
- marlin.py  `MarlinConfig`: `override_quantization_method` selects it when
  `checkpoint_format == "marlin"` or `is_marlin_format`; `from_config` reads `group_size` and
  `lm_head`; group_size must be 128 or -1; `get_supported_act_dtypes` = [float16] and
  `create_weights` raises unless params dtype is float16; per linear: out % min_n_threads (64),
  out % pack_factor (8), in % min_k_threads (128), in % group_size, out % (perm_len / 16^2 = 4)
  (the registered `marlin` format's shape rules: its `shape_refusal` answers them, as the
  `gptq` and `awq` formats' answer theirs below);
  parameters `B` int32 [in / 16, out * 16 / 8] and `s` (params dtype) [groups, out].
- gptq_marlin.py `GPTQMarlinConfig`: `is_gptq_marlin_compatible` needs quant_method "gptq" and
  all of bits, group_size, sym, desc_act; (bits, sym) in {(4, True), (8, True)}; `from_config`
  reads dynamic, lm_head, modules_in_block_to_quantize; parameters `qweight` int32
  [in / pack, out], `g_idx` int32 [in], `qzeros` int32 [groups, out / pack], `scales` [groups, out].
- awq.py `AWQConfig`: `from_config` needs `w_bit|bits` (= 4), `q_group_size|group_size`,
  `zero_point`; act dtype float16; `qweight` int32 [in, out / 8], `qzeros` int32
  [in / group, out / 8], `scales` [in / group, out]; in % group == 0, out % 8 == 0.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from arkinfer.frontend.safetensors_io import read_header, weight_files
from arkinfer.quant.formats.awq import AWQ
from arkinfer.quant.formats.gptq import GPTQ
from arkinfer.quant.formats.marlin import MARLIN

_HALF = ("F16",)
_HALF_OR_BF16 = ("F16", "BF16")


def method_of(qcfg: dict[str, Any]) -> str:
    """The vLLM quantization method this config selects: marlin, gptq_marlin / gptq, awq."""
    if qcfg.get("quant_method") == "gptq":
        if qcfg.get("checkpoint_format") == "marlin" or qcfg.get("is_marlin_format", False):
            return "marlin"
        return "gptq_marlin" if (qcfg.get("bits"), qcfg.get("sym")) in ((4, True), (8, True)) \
            else "gptq"
    return str(qcfg.get("quant_method"))


def _config_problems(raw: dict, qcfg: dict, method: str) -> list[str]:
    p = []
    need = {"marlin": ("group_size",), "gptq_marlin": ("bits", "group_size", "sym", "desc_act"),
            "gptq": ("bits", "group_size", "sym", "desc_act"),
            "awq": ("bits", "group_size", "zero_point")}.get(method)
    if need is None:
        return [f"quant_method {qcfg.get('quant_method')!r} is not gptq / marlin / awq"]
    p += [f"quantization_config lacks {k!r}" for k in need if k not in qcfg]
    if method == "marlin" and qcfg.get("group_size") not in (128, -1):
        p.append(f"marlin group_size {qcfg.get('group_size')} not in (128, -1)")
    if method == "awq" and qcfg.get("bits", qcfg.get("w_bit")) != 4:
        p.append("awq bits must be 4")
    if method in ("marlin", "awq") and raw.get("torch_dtype") != "float16":
        p.append(f"{method} runs float16 activations only; config torch_dtype is "
                 f"{raw.get('torch_dtype')!r}")
    if "lm_head" in qcfg and not isinstance(qcfg["lm_head"], bool):
        p.append("quantization_config.lm_head must be a bool")
    return p


def _linear_problems(method: str, owner: str, t: dict[str, Any], qcfg: dict) -> list[str]:
    """t: suffix -> TensorInfo of one quantised linear."""
    p: list[str] = []

    def want(key: str, dtypes: tuple[str, ...], shape: tuple[int, ...]) -> None:
        if key not in t:
            p.append(f"{owner}.{key} is missing")
        elif t[key].dtype not in dtypes or tuple(t[key].shape) != shape:
            p.append(f"{owner}.{key} is {t[key].dtype} {list(t[key].shape)}, vLLM expects "
                     f"{'|'.join(dtypes)} {list(shape)}")

    group = int(qcfg.get("group_size", 128))
    if method == "marlin":
        fmt, bits = MARLIN, 4
        k, n = t["B"].shape[0] * 16, t["B"].shape[1] // 2
        groups = 1 if group == -1 else k // group
        want("B", ("I32",), (k // 16, n * 16 // 8))
        want("s", _HALF, (groups, n))
    elif method in ("gptq", "gptq_marlin"):
        fmt, bits = GPTQ, int(qcfg.get("bits", 4))
        word = GPTQ.constraints.in_word_bits  # codes and zero points as bit streams of int32s
        n = t["qweight"].shape[1]
        k = t["qweight"].shape[0] * word // bits
        groups = 1 if group == -1 else k // group
        want("qweight", ("I32",), (k * bits // word, n))
        want("g_idx", ("I32",), (k,))
        want("qzeros", ("I32",), (groups, n * bits // word))
        want("scales", _HALF_OR_BF16, (groups, n))
    else:
        fmt, bits = AWQ, 4
        k, n = t["qweight"].shape[0], t["qweight"].shape[1] * 8
        groups = k // group if group > 0 else 1
        want("qweight", ("I32",), (k, n // 8))
        want("qzeros", ("I32",), (groups, n // 8))
        want("scales", _HALF, (groups, n))
    # vLLM's per-linear shape rules are the formats' own: marlin's tiles (out % 64, in % 128),
    # whole int32 words (out % pack_factor) and whole groups (in % group_size)
    why = fmt.shape_refusal(n, k, bits=bits, group_size=group)
    if why is not None:
        p.append(f"{owner}: {why} (vLLM's {method} loader)")
    return p


def vllm_problems(folder: str | Path) -> list[str]:
    """Every way `folder` breaks the rules of the vLLM loader its quantization_config selects."""
    folder = Path(folder)
    raw = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    qcfg = raw.get("quantization_config")
    if not isinstance(qcfg, dict):
        return ["config.json has no quantization_config"]
    method = method_of(qcfg)
    problems = _config_problems(raw, qcfg, method)
    if problems and problems[0].startswith("quant_method"):
        return problems
    infos = {}
    for f in weight_files(folder):
        infos.update(read_header(f))
    key = "B" if method == "marlin" else "qweight"
    owners = sorted(n.rsplit(".", 1)[0] for n in infos if n.endswith(f".{key}"))
    if not owners:
        problems.append(f"no quantised linear (no '*.{key}' tensor)")
    for owner in owners:
        tensors = {n.rsplit(".", 1)[1]: info for n, info in infos.items()
                   if n.rsplit(".", 1)[0] == owner}
        problems += _linear_problems(method, owner, tensors, qcfg)
    return problems
