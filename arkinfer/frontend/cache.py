"""ArkInfer's on-disk cache ($ARKINFER_CACHE, default ~/.cache/arkinfer) and cached GGUF imports.

A GGUF given where a model folder is expected (`arkinfer run model.gguf`) is imported once into
`<cache>/imported/<name>-<key>/` and reused while the file's content and the importer version are
unchanged. The key is a SHA-256 of the whole file, streamed on every use (about 0.2 s per 100 MB):
a path, size and mtime key would reuse a stale import of a file edited with its mtime restored.
Concurrent callers serialise on lock files in the cache.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import os
from collections.abc import Iterator
from pathlib import Path

from arkinfer.errors import GGUFError
from arkinfer.frontend.gguf_import import (IMPORTER_VERSION, ProgressFn, import_gguf,
                                           imported_metadata)
from arkinfer.paths import require_regular_file


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
    """`arkinfer_importer` recorded in an imported folder's first shard, if any."""
    meta = imported_metadata(folder)
    return meta.get("arkinfer_importer") if meta else None


def content_key(path: Path, chunk: int = 1 << 20) -> str:
    """SHA-256 (hex, first 16 digits) of the file's bytes, read in `chunk`-byte pieces."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()[:16]


def cached_import(gguf: Path, out: Path | None = None, progress: ProgressFn | None = None) -> Path:
    """`gguf` imported (float32) into `out` (default: a cache folder keyed by the file's content)."""
    gguf = require_regular_file(Path(gguf).expanduser().resolve(), "GGUF file", GGUFError)
    in_cache = out is None
    if out is None:
        out = cache_dir_path() / "imported" / f"{gguf.stem}-{content_key(gguf)}"
    out.parent.mkdir(parents=True, exist_ok=True)
    with locked(out.parent, f"import-{out.name}"):
        if _importer_version(out) != IMPORTER_VERSION:
            if in_cache and out.is_dir():
                # the cache's own folder, from another importer version or damaged (e.g. half
                # deleted by hand): a folder under the cache is ArkInfer's by where it is
                shutil.rmtree(out)
            import_gguf(gguf, out, dtype="f32", force=True, progress=progress)
    return out
