"""Toolchain versions for an artifact's manifest (`LowerResult.toolchain`).

    version("onnxruntime")             -> "1.22.0", or None when the distribution is not installed
    version("onnx") or "unknown"       # what a manifest records for a missing one
"""

from __future__ import annotations

from importlib import metadata


def version(package: str) -> str | None:
    """The installed version of distribution `package` (its pip name, e.g. "apache-tvm"), or
    None when it is not installed (an importable module without distribution metadata counts
    as not installed)."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None
