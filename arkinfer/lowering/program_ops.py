"""The IR ops a program uses against the ops a lowering takes: one check for every backend.

    undeclared_ops(program, caps.ops)             # op -> every node using it: {"rope_table":
                                                  # ["prefill:%rope (model.layers.0.self_attn)",
                                                  #  ...]}
    check_program_ops(program, "tvm", caps.ops)   # TargetError naming each op, its node count
                                                  # and its first nodes

build runs `check_program_ops` on the traced program (after the backend's `ir_passes`, before
quantise) against `Capabilities.ops`, for every backend that lowers from the IR; a backend's
preflight may run it at plan time against its lowering's own op table (tvm: `LOWERINGS`, coreml:
`CONVERSIONS`) on a program traced from config.json alone.

A node is named `ENTRY:%NAME (SOURCE)`: its entry point, its value name as `arkinfer ir` prints
it, and the nn.Module path it was traced from (the layer), when it has one.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING

from arkinfer.errors import TargetError

if TYPE_CHECKING:
    from arkinfer.ir.graph import Program

SHOWN_NODES = 3  # nodes named per op in the message; the count says how many more use it


def undeclared_ops(program: Program, ops: Collection[str]) -> dict[str, list[str]]:
    """IR op -> the nodes of `program` (every entry point) whose op is not in `ops`, in order."""
    declared = {str(op) for op in ops}
    out: dict[str, list[str]] = {}
    for graph in program.entries.values():
        for node in graph.nodes:
            if str(node.op) not in declared:
                layer = f" ({node.source})" if node.source else ""
                out.setdefault(str(node.op), []).append(f"{graph.name}:%{node.name}{layer}")
    return out


def raise_undeclared(missing: Mapping[str, Sequence[str]], lowering: str, hint: str) -> None:
    """Raise TargetError naming every op of `missing` (op -> nodes) that `lowering` has no
    lowering for; nothing when `missing` is empty."""
    if not missing:
        return
    where = "; ".join(
        f"{op} at {len(nodes)} node(s): {', '.join(nodes[:SHOWN_NODES])}"
        + (", ..." if len(nodes) > SHOWN_NODES else "") for op, nodes in missing.items())
    raise TargetError(f"IR op(s) {', '.join(missing)} have no {lowering} lowering ({where})",
                      hint=hint)


def check_program_ops(program: Program, backend: str, ops: Collection[str],
              hint: str | None = None) -> None:
    """Raise TargetError unless every op of `program` is in `ops` (the backend's declared
    `Capabilities.ops`, or its lowering's own op table)."""
    hint = hint or (f"the {backend} backend lowers {', '.join(map(str, ops))} (its "
                    "Capabilities.ops); build with another backend (`arkinfer targets show "
                    "TARGET` lists them), or add the op to its lowering and its Capabilities.ops")
    raise_undeclared(undeclared_ops(program, ops), backend, hint)
