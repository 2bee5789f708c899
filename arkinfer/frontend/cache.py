"""ArkInfer's on-disk cache ($ARKINFER_CACHE, default ~/.cache/arkinfer) and cached GGUF imports.

A GGUF given where a model folder is expected (`arkinfer run model.gguf`) is imported once into
`<cache>/imported/<name>-<key>/` and reused while the file (path, size, mtime) and the importer
version are unchanged. Concurrent callers serialise on lock files in the cache.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
from collections.abc import Iterator
from pathlib import Path

from arkinfer.frontend.gguf_import import IMPORTER_VERSION, ProgressFn, import_gguf


def cache_dir_path(cache_dir: str | Path | None = None) -> Path:
    """`cache_dir`, else $ARKINFER_CACHE, else ~/.cache/arkinfer (created if missing)."""
    root = Path(cache_dir or os.environ.get("ARKINFER_CACHE") or "~/.cache/arkinfer").expanduser()
    root.mkdir(parents=True, exist_ok=True)
    return root


@contextlib.contextmanager
def locked(root: Path, name: str) -> Iterator[None]:
    """An exclusive advisory lock on `root/.name.lock` (no-op where fcntl does not exist)."""
    try:
        import fcntl
    except ImportError:  # Windows: callers there do not run tests in parallel
        yield
        return
    with open(root / f".{name}.lock", "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _importer_version(folder: Path) -> str | None:
    """`arkinfer_importer` from the first safetensors header of an imported folder, if any."""
    files = sorted(folder.glob("*.safetensors"))
    if not files or not (folder / "config.json").is_file():
        return None
    try:
        with open(files[0], "rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(min(size, 100 << 20)))
        return header.get("__metadata__", {}).get("arkinfer_importer")
    except (OSError, struct.error, ValueError):
        return None


def cached_import(gguf: Path, out: Path | None = None, progress: ProgressFn | None = None) -> Path:
    """`gguf` imported (float32) into `out` (default: a folder in the cache keyed by the file)."""
    gguf = Path(gguf).expanduser().resolve()
    if out is None:
        st = gguf.stat()
        key = hashlib.sha256(f"{gguf}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:12]
        out = cache_dir_path() / "imported" / f"{gguf.stem}-{key}"
    out.parent.mkdir(parents=True, exist_ok=True)
    with locked(out.parent, f"import-{out.name}"):
        if _importer_version(out) != IMPORTER_VERSION:
            import_gguf(gguf, out, dtype="f32", force=True, progress=progress)
    return out
