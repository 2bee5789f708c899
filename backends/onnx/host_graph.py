"""The host runner's graph: the artifact's model.onnx with onnxruntime's fast ops swapped in
(contrib.py, contrib_fused.py, contrib_pack.py, kv_shared.py), rewritten once per artifact and
runner setting and saved in ArkInfer's cache, so a later load is a session from a file

    <cache>/onnx-host/<key>/model.onnx, model.onnx.data   the rewritten graph
    <cache>/onnx-host/<key>/rewrite.json                  what the rewrite did (HostGraph fields)

<cache> is $ARKINFER_CACHE or ~/.cache/arkinfer. The key is a SHA-256 over the artifact's
model.onnx and external-data files (their content, not their dates), ops, accuracy_level and
the source of the rewrite modules, so an edited artifact or a changed rewrite never reuses a
stale graph. An entry is written into a temporary folder and renamed into place when complete
(a crash leaves no half-written entry); a cache that cannot be written (read-only, full) is
reported in `notes` and the graph runs from memory as before.

Why: the rewrite reads, edits and re-serialises the whole model in Python: SmolLM2-135M's runner
starts in 5.1 s that way, in 0.5 s from the saved file, hashing the artifact included
(`load_s` of benchmarks/onnx_vs_llamacpp.py).
ARKINFER_ONNX_HOST_CACHE=0 (or `OnnxRunner(..., cache=False)`) rewrites in memory on every load;
ARKINFER_ONNX_HOST_CACHE=<folder> keeps the entries there instead (the test suite uses a
temporary one).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import onnx

from arkinfer.frontend.cache import cache_dir_path, content_key, locked

from . import contrib, contrib_fused, contrib_pack, kv_shared

REWRITE_FILE = "rewrite.json"
_ENTRY_FILES = ("model.onnx", "model.onnx.data", REWRITE_FILE)
MAX_POSITIONS_KEY = "arkinfer.max_positions"  # metadata: rows of the rope caches GQA reads
ACCURACY_LEVEL_KEY = "arkinfer.accuracy_level"  # metadata: `--option accuracy_level` (options.py)
DEFAULT_MAX_POSITIONS = 8192  # for a graph without that key
_MODULES = (contrib, contrib_fused, contrib_pack, kv_shared)


@dataclasses.dataclass
class HostGraph:
    """A rewritten graph: `path` (a saved model.onnx) or `model_bytes` (not saved), and what the
    rewrite did."""
    path: Path | None
    model_bytes: bytes | None
    replaced: int = 0                  # linears now com.microsoft.MatMulNBits
    notes: list[str] = dataclasses.field(default_factory=list)   # nodes kept, cache problems
    fused: dict[str, int] = dataclasses.field(default_factory=dict)  # functions -> contrib ops
    packed_qkv: int = 0                # attentions whose q/k/v MatMulNBits became one
    packed_siblings: int = 0           # other MatMulNBits groups on one input (gate + up) packed
    max_positions: int | None = None   # rows of GroupQueryAttention's cos/sin caches
    shared_kv: bool = False            # KV in bound buffers GQA updates in place (kv_shared.py)

    def session_source(self) -> str | bytes:
        """What onnxruntime.InferenceSession takes: the saved file's path, or the bytes."""
        return str(self.path) if self.path is not None else self.model_bytes


def rewrite(model: onnx.ModelProto, ops: str, accuracy_level: int) -> dict:
    """Rewrite `model` in place for ops="contrib" (every swap) or "nbits" (the linears only);
    returns the HostGraph fields it fills."""
    replaced, notes = contrib.use_matmul_nbits(model, accuracy_level=accuracy_level)
    info = {"replaced": replaced, "notes": notes}
    if ops == "contrib":
        props = {p.key: p.value for p in model.metadata_props}
        info["max_positions"] = int(props.get(MAX_POSITIONS_KEY, DEFAULT_MAX_POSITIONS))
        info["fused"], fused_notes = contrib_fused.use_fused_ops(model, info["max_positions"])
        info["notes"] = notes + fused_notes
        info["packed_qkv"] = contrib_pack.pack_qkv(model)
        info["packed_siblings"] = contrib_pack.pack_siblings(model)
        info["shared_kv"] = kv_shared.shareable(model)
    return info


def _external_files(path: Path) -> list[Path]:
    """The external-data files model.onnx names (each once, in order)."""
    model = onnx.load(str(path), load_external_data=False)
    names: list[str] = []
    for t in model.graph.initializer:
        for entry in t.external_data:
            if entry.key == "location" and entry.value not in names:
                names.append(entry.value)
    return [path.parent / n for n in names]


def stored_accuracy_level(path: Path) -> int | None:
    """The accuracy level the artifact was built with (`--option accuracy_level`), read from
    model.onnx's metadata without its weights; None when the build did not set one."""
    model = onnx.load(str(path), load_external_data=False)
    props = {p.key: p.value for p in model.metadata_props}
    value = props.get(ACCURACY_LEVEL_KEY)
    return None if value is None else int(value)


def cache_key(path: Path, ops: str, accuracy_level: int) -> str:
    digest = hashlib.sha256(f"{ops}|{accuracy_level}|".encode())
    for source in (path, *_external_files(path)):
        digest.update(f"{source.name}:{content_key(source)}|".encode())
    for module in (*_MODULES, contrib_fused.fn_fused):
        digest.update(Path(module.__file__).read_bytes())
    digest.update(Path(__file__).read_bytes())
    return digest.hexdigest()[:20]


def cache_root(cache: bool = True) -> Path | None:
    """The folder of the entries, or None when caching is off (`cache` or the environment)."""
    setting = os.environ.get("ARKINFER_ONNX_HOST_CACHE", "1")
    if not cache or setting == "0":
        return None
    return cache_dir_path() / "onnx-host" if setting == "1" else Path(setting).expanduser()


def host_graph(path: Path, ops: str, accuracy_level: int, cache: bool = True) -> HostGraph:
    """The rewritten graph of the artifact's model.onnx at `path`: from the cache when an entry
    for this artifact and setting exists, else rewritten now (and saved, when `cache`)."""
    root = cache_root(cache)
    if root is None:
        return _in_memory(path, ops, accuracy_level, [])
    try:
        root.mkdir(parents=True, exist_ok=True)
        entry = root / cache_key(path, ops, accuracy_level)
        with locked(root, entry.name):
            if not all((entry / name).is_file() for name in _ENTRY_FILES):
                _save(path, ops, accuracy_level, entry)   # absent, or files deleted by hand
        info = json.loads((entry / REWRITE_FILE).read_text())
        return HostGraph(path=entry / "model.onnx", model_bytes=None, **info)
    except OSError as exc:
        why = f"the rewritten graph was not cached ({exc}); it was rewritten in memory"
        return _in_memory(path, ops, accuracy_level, [why])


def _rewritten(path: Path, ops: str, accuracy_level: int) -> tuple[onnx.ModelProto, dict]:
    model = onnx.load(str(path))
    return model, rewrite(model, ops, accuracy_level)


def _in_memory(path: Path, ops: str, accuracy_level: int, notes: list[str]) -> HostGraph:
    model, info = _rewritten(path, ops, accuracy_level)
    info["notes"] = [*info["notes"], *notes]
    return HostGraph(path=None, model_bytes=model.SerializeToString(), **info)


def _save(path: Path, ops: str, accuracy_level: int, entry: Path) -> None:
    """Rewrite and write the entry: into a temporary folder beside it, renamed when complete."""
    model, info = _rewritten(path, ops, accuracy_level)
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}-", dir=entry.parent))
    try:
        onnx.save_model(model, str(tmp / "model.onnx"), save_as_external_data=True,
                        all_tensors_to_one_file=True, location="model.onnx.data",
                        size_threshold=1024)
        (tmp / REWRITE_FILE).write_text(json.dumps(info, indent=1) + "\n")
        if entry.exists():      # an entry with files missing: replaced whole
            shutil.rmtree(entry)
        os.replace(tmp, entry)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
