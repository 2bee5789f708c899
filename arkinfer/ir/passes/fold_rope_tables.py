"""Pass `fold_rope_tables`: precompute RoPE's cos/sin as a table weight indexed by position.

What can fold while positions are symbolic? Not cos/sin of the call's own positions (they are a
graph input), but everything else: RoPE's angle is `p * inv_freq[j]` for an integer position p
below the program's `max_len`, so `table[p] = cat(cos(p * inv_freq), sin(p * inv_freq)) * scale`
([max_len, D], fp32) holds every value any call can need, and the op becomes a row gather
(`rope_table`). The attention scale is folded into the table. LongRoPE gets one table per factor
set (`table` / `table_long`, same switch attributes). Computed exactly as the rope op computes
its angles (fp32 position times fp32 frequency), so results match the unfolded graph.

Cost: max_len x head_dim x 4 bytes per table (MiniCPM4.1-8B: 65536 x 128 x 4 = 32 MiB; one
table since its factor sets are equal). Built lazily; a meta tensor in shape-only programs.
"""

from __future__ import annotations

import torch

from arkinfer.ir.errors import IRError
from arkinfer.ir.graph import Program
from arkinfer.ir.ops import Op
from arkinfer.ir.types import DType, TensorType
from arkinfer.ir.weights import Weight, WeightStore


def _table(store: WeightStore, inv_name: str, scale: float, rows: int,
           made: dict[tuple[str, float], str]) -> str:
    key = (inv_name, scale)
    if key in made:
        return made[key]
    base = inv_name.replace("inv_freq", "cos_sin") if "inv_freq" in inv_name else f"{inv_name}.cos_sin"
    name, k = base, 1
    while name in store:  # another scale of the same frequencies gets its own table
        name, k = f"{base}.{k}", k + 1
    inv = store[inv_name]
    t = TensorType(DType.F32, (rows, 2 * int(inv.type.shape[0])))

    def build() -> torch.Tensor:
        angles = torch.arange(rows).to(torch.float32)[:, None] * inv.tensor().to(torch.float32)[None, :]
        return torch.cat([angles.cos() * scale, angles.sin() * scale], dim=-1)

    if inv.has_data:
        store.add(Weight(name, t, loader=build))
    else:
        store.add(Weight(name, t, data=torch.empty(t.concrete({}), device="meta")))
    made[key] = name
    return name


def fold_rope_tables(program: Program) -> Program:
    """Every `rope` node -> `rope_table` over tables of `program.meta['max_len']` rows."""
    rows = program.meta.get("max_len")
    if not isinstance(rows, int) or rows < 1:
        raise IRError("fold_rope_tables needs program.meta['max_len'] (the longest total length)",
                      hint="trace the program with arkinfer.ir.trace, which records it")
    out = program.copy()
    made: dict[tuple[str, float], str] = {}
    for graph in out.entries.values():
        for node in graph.nodes:
            if node.op != Op.ROPE:
                continue
            a = node.attrs
            scale = float(a["scale"])
            attrs = {"table": _table(out.weights, a["inv_freq"], scale, rows, made)}
            if a.get("inv_freq_long") is not None:
                attrs.update(table_long=_table(out.weights, a["inv_freq_long"], scale, rows, made),
                             long_after=a["long_after"], length=a["length"])
            node.op, node.attrs = Op.ROPE_TABLE, attrs
    return out
