"""The decoder layers of a runner's graph, found on the graph itself: the residual stream entering
each layer (EAGLE-3's taps) and the graph of the first N layers (the `self:N` draft).

Every residual add of the lowering is fused into the norm after it (groups.py), so the residual
stream is a chain of skip norms, whatever the ops mode:

    ops="function" / "nbits"   arkinfer.SkipRMSNorm(x, skip, w)                    -> (y, sum)
    ops="contrib"              com.microsoft.SkipSimplifiedLayerNormalization(x, skip, w)
                                                                          -> (y, -, -, sum)

    h0 = embed --> P0 --> I1 --> P1 --> I2 --> ... --> I(L-1) --> P(L-1) --> F --> LM head
                  post-attention norm of layer l: Pl;  input norm of layer i: Ii;  final norm: F

It is found backwards from `logits`: F is the first skip norm above the logits, and each norm's
predecessor is the skip norm whose sum is one of its two addends; h0 (the embedding) comes from
no norm, which ends the chain. The chain must hold 2L norms for the L layers of past.{i}.k, and
each Ii's normed output must reach the attention reading past.{i}.k before the next norm of the
chain: a graph off that pattern is refused (NotAvailableError), never guessed at.

    tap i (1 <= i <= L-1)  = Ii's sum: the residual stream at the INPUT of layer i (taps.py)
    first N layers         = F reads Ii's two addends instead of its own (so F normalises the
                             stream entering layer N with the final norm's weight and epsilon),
                             then every node, cache input / output and initializer that no longer
                             leads to an output is dropped
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import onnx
from onnx import TensorProto, helper

from arkinfer.errors import ArkError, NotAvailableError

from .contrib import MS_DOMAIN, keep_read_initializers
from .onnx_build import DOMAIN

#: skip norms (domain, op) -> index of their `sum` output (x + skip: the residual stream)
SKIP_NORMS = {(DOMAIN, "SkipRMSNorm"): 1, (MS_DOMAIN, "SkipSimplifiedLayerNormalization"): 3}
_CACHE = re.compile(r"^(?:past|present)\.(\d+)\.")


def load_graph(source: str | bytes) -> onnx.ModelProto:
    """A session source (a model.onnx path, or serialised bytes) as a ModelProto; a file's
    external weights stay on disk (the proto keeps their references)."""
    if isinstance(source, bytes):
        return onnx.load_from_string(source)
    return onnx.load(source, load_external_data=False)


def _is_skip(node: onnx.NodeProto) -> bool:
    return (node.domain, node.op_type) in SKIP_NORMS


def _sum_index(node: onnx.NodeProto) -> int:
    return SKIP_NORMS[(node.domain, node.op_type)]


@dataclasses.dataclass
class LayerChain:
    """The skip norms of a graph's residual stream, in order: [P0, I1, P1, ..., P(L-1), F]."""

    model: onnx.ModelProto
    norms: list[onnx.NodeProto]
    layers: int

    @property
    def final(self) -> onnx.NodeProto:
        return self.norms[-1]

    def entering(self, i: int) -> onnx.NodeProto:
        """The input norm of layer i (1 <= i <= L-1), whose sum is the stream entering it."""
        return self.norms[2 * i - 1]

    def stream(self, i: int) -> str:
        """The value name of the residual stream entering layer i (named here when unnamed)."""
        node = self.entering(i)
        at = _sum_index(node)
        while len(node.output) <= at:
            node.output.append("")
        if not node.output[at]:
            node.output[at] = f"{node.name or node.output[0]}/residual"
        return node.output[at]

    def hidden_size(self) -> int:
        """H of the residual stream: the final norm's weight [H] (an initializer, or a Cast of
        one for weights stored in f16 / bf16); 0 when it is neither."""
        inits = {t.name: t for t in self.model.graph.initializer}
        producer = {o: n for n in self.model.graph.node for o in n.output}
        name = self.final.input[2]
        while name not in inits and name in producer and \
                producer[name].op_type in ("Cast", "Identity"):
            name = producer[name].input[0]
        return int(inits[name].dims[-1]) if name in inits else 0


def layer_count(model: onnx.ModelProto) -> int:
    """Decoder layers of a graph: its past.{i}.k inputs."""
    return sum(1 for i in model.graph.input if re.fullmatch(r"past\.\d+\.k", i.name))


def find_layers(model: onnx.ModelProto, where: str) -> LayerChain:
    """The residual chain of `model` (module docstring); NotAvailableError naming `where` when
    the graph is not made of L layers joined by skip norms."""
    graph, layers = model.graph, layer_count(model)
    producer = {o: n for n in graph.node for o in n.output if o}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)

    def refuse(why: str) -> NotAvailableError:
        return NotAvailableError(f"the graph of {where} is not one ArkInfer's layer finder knows: "
                                 f"{why}", hint="use --draft lookup, or a draft model's artifact")

    final, todo, seen = None, ["logits"], set()
    while todo and final is None:          # breadth-first up from the logits
        node = producer.get(todo.pop(0))
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if _is_skip(node):
            final = node
        todo += list(node.input)
    if final is None:
        raise refuse("no residual-add norm above the logits")
    norms = [final]
    while True:
        before = [producer.get(x) for x in norms[-1].input[:2]]
        before = [n for n in before if n is not None and _is_skip(n) and
                  n.output[_sum_index(n)] in norms[-1].input[:2]]
        if not before:
            break
        norms.append(before[0])
    norms.reverse()
    if len(norms) != 2 * layers:
        raise refuse(f"{len(norms)} residual-add norms for {layers} layers (2 per layer expected)")
    chain = LayerChain(model, norms, layers)
    members = {id(n) for n in norms}
    for i in range(1, layers):              # Ii's normed output reaches layer i's attention
        todo, seen, found = [chain.entering(i).output[0]], set(), False
        while todo and not found:
            for node in readers.get(todo.pop(), []):
                if id(node) in members or id(node) in seen:
                    continue
                seen.add(id(node))
                found = f"past.{i}.k" in node.input
                todo += [o for o in node.output if o]
        if not found:
            raise refuse(f"the norm before layer {i}'s attention does not reach past.{i}.k")
    return chain


def add_tap_outputs(model: onnx.ModelProto, layers: tuple[int, ...],
                    where: str) -> tuple[list[str], int]:
    """Make the residual stream entering each of `layers` a graph output f32 [1, T, H] (in
    place); returns their names, in `layers` order, and H."""
    chain = find_layers(model, where)
    width = chain.hidden_size()
    if not width:
        raise NotAvailableError(f"the graph of {where}: the width of its residual stream is not "
                                "known (the final norm's weight is no initializer)",
                                hint="use --draft lookup, or a draft model's artifact")
    names = [chain.stream(i) for i in layers]
    present = {o.name for o in model.graph.output}
    for name in dict.fromkeys(names):
        if name not in present:
            model.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    return names, width


def keep_first_layers(model: onnx.ModelProto, n: int, where: str) -> None:
    """Cut `model` (in place) to its first `n` layers, final norm and LM head (module docstring);
    its caches are then past.{i}.k/.v and present.{i}.k/.v for i < n."""
    chain = find_layers(model, where)
    if not 1 <= n < chain.layers:
        raise ArkError(f"first_layers({n}): {where} has {chain.layers} layers; take "
                       f"1..{chain.layers - 1}", hint=f"e.g. first_layers({max(1, chain.layers // 2)})")
    entering = chain.entering(n)
    chain.final.input[0], chain.final.input[1] = entering.input[0], entering.input[1]
    graph = model.graph

    def kept(name: str) -> bool:
        m = _CACHE.match(name)
        return m is None or int(m.group(1)) < n

    outputs = [o for o in graph.output if kept(o.name)]
    del graph.output[:]
    graph.output.extend(outputs)
    needed = {o.name for o in outputs}
    nodes = []
    for node in reversed(graph.node):       # nodes are in topological order
        if needed & set(node.output):
            nodes.append(node)
            needed |= set(node.input)
    del graph.node[:]
    graph.node.extend(reversed(nodes))
    inputs = [i for i in graph.input if kept(i.name) and i.name in needed]
    del graph.input[:]
    graph.input.extend(inputs)
    produced = {o for node in nodes for o in node.output}
    info = [v for v in graph.value_info if v.name in produced]
    del graph.value_info[:]
    graph.value_info.extend(info)
    keep_read_initializers(model)
    used = {(node.domain, node.op_type) for node in nodes}
    functions = [f for f in model.functions if (f.domain, f.name) in used]
    del model.functions[:]
    model.functions.extend(functions)


def external_folder(source: str | bytes) -> Path | None:
    """Where a session source's external weights lie: a path's folder; None for bytes."""
    return None if isinstance(source, bytes) else Path(source).parent
