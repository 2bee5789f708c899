"""Save a Program to a folder and load it back.

    <folder>/graph.json          {"format": "arkinfer-ir", "schema_version": 1, "meta": {...},
                                  "weights": {name: {"dtype", "shape", "quant"}},
                                  "entries": {name: {"dims", "constraints", "inputs", "nodes",
                                                     "outputs"}}}
    <folder>/weights.safetensors every weight with data, under its store name

A node is {"name", "op", "inputs", "attrs", "type": {"dtype", "shape"}, "source"}; shapes hold ints
and dim expressions ("P+T"). Weights are written one at a time (the safetensors header is written
first), so saving never holds more than one weight beyond what the store already holds; loading
memory-maps them and reads each on first use. A program traced shape-only saves with
`weights=False` and loads as shape-only. Loading checks the format, the schema version and runs
the verifier.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import torch

from arkinfer.ir.errors import SchemaError
from arkinfer.ir.graph import Graph, Input, Node, Program
from arkinfer.ir.ops import parse_op
from arkinfer.ir.types import DType, TensorType
from arkinfer.ir.verify import verify
from arkinfer.ir.weights import QuantSpec, Weight, WeightStore

FORMAT = "arkinfer-ir"
SCHEMA_VERSION = 1
GRAPH_FILE, WEIGHTS_FILE = "graph.json", "weights.safetensors"
_ST_DTYPES = {DType.F32: "F32", DType.F16: "F16", DType.BF16: "BF16", DType.I64: "I64",
              DType.I32: "I32", DType.I8: "I8", DType.U8: "U8", DType.BOOL: "BOOL"}


def program_to_json(program: Program) -> dict[str, Any]:
    return {
        "format": FORMAT, "schema_version": SCHEMA_VERSION, "meta": program.meta,
        "weights": {w.name: {**w.type.to_json(), "quant": w.quant.to_json() if w.quant else None}
                    for w in program.weights},
        "entries": {name: _graph_to_json(g) for name, g in program.entries.items()},
    }


def _graph_to_json(g: Graph) -> dict[str, Any]:
    return {
        "dims": {k: list(v) for k, v in g.dims.items()},
        "constraints": [[e, b] for e, b in g.constraints],
        "inputs": [{"name": i.name, "type": i.type.to_json()} for i in g.inputs],
        "nodes": [{"name": n.name, "op": n.op.value, "inputs": n.inputs, "attrs": n.attrs,
                   "type": n.type.to_json(), "source": n.source} for n in g.nodes],
        "outputs": [{"name": k, "value": v} for k, v in g.outputs.items()],
    }


def _write_safetensors(path: Path, program: Program) -> None:
    """Stream every weight into one safetensors file (header first, then data in order)."""
    header: dict[str, Any] = {"__metadata__": {"format": FORMAT}}
    offset = 0
    for w in program.weights:
        n = int(torch.Size(w.type.concrete({})).numel()) * w.type.dtype.torch.itemsize
        header[w.name] = {"dtype": _ST_DTYPES[w.type.dtype], "shape": list(w.type.shape),
                          "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        for w in program.weights:
            t = w.tensor().detach().to("cpu").contiguous()
            fh.write(t.reshape(-1).view(torch.uint8).numpy().tobytes())


def save(program: Program, folder: str | Path, weights: bool = True) -> Path:
    """Write graph.json (+ weights.safetensors unless weights=False); returns the folder."""
    folder = Path(folder)
    verify(program)
    if weights:
        empty = [w.name for w in program.weights if not w.has_data]
        if empty:
            raise SchemaError(f"{len(empty)} weight(s) have no data, e.g. '{empty[0]}' (the program "
                              "was traced shape-only)", hint="save with weights=False, or trace "
                              "from a checkpoint folder or a loaded model")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / GRAPH_FILE).write_text(json.dumps(program_to_json(program), indent=1) + "\n",
                                     encoding="utf-8")
    if weights:
        _write_safetensors(folder / WEIGHTS_FILE, program)
    return folder


def program_from_json(data: dict[str, Any], source: str = GRAPH_FILE) -> tuple[Program, dict]:
    """(Program with shape-only weights, the weight table) from graph.json's content."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise SchemaError(f"{source} is not an ArkInfer IR file (format != {FORMAT!r})")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise SchemaError(f"{source} has schema_version {version!r}; this ArkInfer reads "
                          f"{SCHEMA_VERSION}", hint="re-trace the model with this version")
    try:
        store = WeightStore()
        for name, w in data["weights"].items():
            t = TensorType.from_json(w)
            quant = QuantSpec.from_json(w["quant"]) if w.get("quant") else None
            store.add(Weight(name, t, data=torch.empty(t.concrete({}), dtype=t.dtype.torch,
                                                       device="meta"), quant=quant))
        entries = {}
        for name, g in data["entries"].items():
            entries[name] = Graph(
                name, [Input(i["name"], TensorType.from_json(i["type"])) for i in g["inputs"]],
                [Node(n["name"], parse_op(n["op"]), list(n["inputs"]), dict(n["attrs"]),
                      TensorType.from_json(n["type"]), n.get("source")) for n in g["nodes"]],
                {o["name"]: o["value"] for o in g["outputs"]},
                {k: (int(v[0]), int(v[1])) for k, v in g["dims"].items()},
                [(str(e), int(b)) for e, b in g["constraints"]])
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise SchemaError(f"{source} is malformed: {type(exc).__name__}: {exc}",
                          hint="the file was edited or truncated; save the program again") from None
    return Program(entries, store, dict(data.get("meta", {}))), data["weights"]


def load(folder: str | Path) -> Program:
    """The Program saved in `folder`; weights memory-mapped and read on first use."""
    folder = Path(folder)
    path = folder / GRAPH_FILE
    if not path.exists():
        raise SchemaError(f"{folder} has no {GRAPH_FILE}", hint="save a program there with ir.save")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SchemaError(f"{path} is not valid JSON: {exc}") from None
    program, _table = program_from_json(data, str(path))
    weights_path = folder / WEIGHTS_FILE
    if weights_path.exists():
        from safetensors import safe_open

        handle = safe_open(str(weights_path), framework="pt")
        stored = set(handle.keys())
        missing = [w.name for w in program.weights if w.name not in stored]
        if missing:
            raise SchemaError(f"{weights_path} lacks {len(missing)} weight(s), e.g. '{missing[0]}'",
                              hint="the weights file belongs to another graph; save again")
        program.weights = WeightStore({
            w.name: Weight(w.name, w.type, loader=lambda n=w.name: handle.get_tensor(n),
                           quant=w.quant) for w in program.weights})
    return verify(program)
