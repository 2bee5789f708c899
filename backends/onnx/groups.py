"""Which IR nodes the ONNX lowering emits as one fused function (fn_fused.py) instead of one node
group each: found on the IR (typed, ordered, every op's meaning fixed), not on the ONNX graph.

    attention  proj_q -> reshape [B,T,Hq,D] -> transpose(1,2) -> rope ─┐
               proj_k -> reshape -> transpose(1,2) -> rope -> concat(past_k, ., 2) ─┤ attention
               proj_v -> reshape -> transpose(1,2) -> concat(past_v, ., 2) ─────────┘ (dense)
               -> transpose(1,2) -> reshape [B,T,Hq*D]          = arkinfer.RotaryGQA
    norm       add(a, b) (same shapes: the residual) -> rms_norm = arkinfer.SkipRMSNorm

Attention with a sparse_config (InfLLM v2), RoPE on normed q/k (Qwen3's qk_norm) or anything
else off the pattern keeps the per-op lowering; a group is only taken when its inner values have
no reader outside it, so nothing else in the graph needs them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from arkinfer.ir.graph import Graph, Node
from arkinfer.ir.ops import Op

_ROPE_ATTRS = ("inv_freq", "scale", "inv_freq_long", "long_after", "length")


@dataclass
class AttentionGroup:
    """One RotaryGQA: IR value names of its operands, the rope and attention nodes (attributes)
    and the cache values its present outputs stand for; emitted at `anchor` (the last node)."""

    anchor: str
    query: str
    key: str
    value: str
    past_key: str
    past_value: str
    positions: str
    rope: Node
    attention: Node
    present_key: str
    present_value: str
    num_heads: int
    kv_num_heads: int


@dataclass
class Groups:
    attention: dict[str, AttentionGroup] = field(default_factory=dict)  # anchor -> group
    skip_norm: dict[str, Node] = field(default_factory=dict)            # rms_norm -> its add
    absorbed: set[str] = field(default_factory=set)                     # nodes not emitted alone


class _Finder:
    def __init__(self, graph: Graph) -> None:
        self.producer = {n.name: n for n in graph.nodes}
        self.order = {n.name: i for i, n in enumerate(graph.nodes)}
        self.users = {k: [n.name for n in v] for k, v in graph.users().items()}
        self.inputs = {i.name for i in graph.inputs}
        self.outputs = set(graph.outputs.values())

    def only_user(self, value: str, user: str) -> bool:
        return self.users.get(value) == [user] and value not in self.outputs

    def op(self, value: str, op: Op) -> Node | None:
        n = self.producer.get(value)
        return n if n is not None and n.op == op else None

    def heads(self, value: str, user: str) -> tuple[Node, Node] | None:
        """(transpose, reshape) when `value` is transpose(1,2) of reshape [B,T,H,D] of a
        [B,T,H*D] value, each read once."""
        t = self.op(value, Op.TRANSPOSE)
        if t is None or {t.attrs["dim0"], t.attrs["dim1"]} != {1, 2} or \
                not self.only_user(value, user):
            return None
        r = self.op(t.inputs[0], Op.RESHAPE)
        if r is None or r.type.rank != 4 or not self.only_user(r.name, t.name):
            return None
        return t, r

    def rope_of_heads(self, value: str, user: str):
        rope = self.op(value, Op.ROPE)
        if rope is None or not self.only_user(value, user):
            return None
        heads = self.heads(rope.inputs[0], rope.name)
        return None if heads is None else (rope, *heads)

    def cache_concat(self, value: str, user: str) -> Node | None:
        cat = self.op(value, Op.CONCAT)
        if cat is None or cat.attrs["dim"] != 2 or len(cat.inputs) != 2 or \
                cat.inputs[0] not in self.inputs or self.users.get(value) != [user]:
            return None
        return cat

    def attention(self, a: Node) -> tuple[AttentionGroup, list[str]] | None:
        if a.op != Op.ATTENTION or a.attrs.get("sparse_config"):
            return None
        q = self.rope_of_heads(a.inputs[0], a.name)
        cat_k, cat_v = self.cache_concat(a.inputs[1], a.name), self.cache_concat(a.inputs[2], a.name)
        if q is None or cat_k is None or cat_v is None:
            return None
        k = self.rope_of_heads(cat_k.inputs[1], cat_k.name)
        v = self.heads(cat_v.inputs[1], cat_v.name)
        out_t = self.users.get(a.name, [None])[0]
        if k is None or v is None or len(self.users.get(a.name, [])) != 1:
            return None
        t = self.producer[out_t]
        if t.op != Op.TRANSPOSE or {t.attrs["dim0"], t.attrs["dim1"]} != {1, 2} or \
                len(self.users.get(t.name, [])) != 1 or t.name in self.outputs:
            return None
        out = self.producer[self.users[t.name][0]]
        rq, rk = q[0], k[0]
        if out.op != Op.RESHAPE or out.type.rank != 3 or rq.inputs[1] != rk.inputs[1] or \
                any(rq.attrs.get(x) != rk.attrs.get(x) for x in _ROPE_ATTRS):
            return None
        hq, hkv = q[2].type.shape[2], k[2].type.shape[2]
        if not isinstance(hq, int) or not isinstance(hkv, int) or hq % hkv:
            return None
        group = AttentionGroup(out.name, q[2].inputs[0], k[2].inputs[0], v[1].inputs[0],
                               cat_k.inputs[0], cat_v.inputs[0], rq.inputs[1], rq, a,
                               cat_k.name, cat_v.name, hq, hkv)
        inner = [*(n.name for n in (*q, *k, *v, cat_k, cat_v)), a.name, t.name]
        return group, inner

    def skip_norm(self, n: Node) -> Node | None:
        add = self.op(n.inputs[0], Op.ADD)
        if n.op != Op.RMS_NORM or add is None:
            return None
        types = [self.producer[i].type if i in self.producer else None for i in add.inputs]
        if any(t is None or t.shape != add.type.shape for t in types):
            return None  # a broadcast add is not a residual
        # the add's other readers must come after the norm, where the fused sum exists
        if any(self.order[u] < self.order[n.name] for u in self.users[add.name] if u != n.name):
            return None
        return add


def find_groups(graph: Graph) -> Groups:
    f, out = _Finder(graph), Groups()
    for n in graph.nodes:
        found = f.attention(n)
        if found is not None:
            group, inner = found
            out.attention[group.anchor] = group
            out.absorbed.update(inner)
        add = f.skip_norm(n)
        if add is not None and add.name not in out.absorbed:
            out.skip_norm[n.name] = add
            out.absorbed.add(add.name)
    return out
