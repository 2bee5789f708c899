"""Which llama.cpp runs a GGUF artifact on this machine: the InfLLM v2 build or upstream.

    patched_library_dir()   lib/ of the InfLLM v2 build (`arkinfer doctor --build-llamacpp`),
                            None when it is not built or ARKINFER_LLAMACPP=upstream
    infllmv2_built()        the probe the backend's capabilities declare (`OptionalRuntime.built`):
                            True when that build is here, so plan predicts sparse rows
    library_for(path)       the library a Runner of `path` loads: the InfLLM v2 build for a file
                            with a sparse_config when it is built, else None (upstream llama.cpp)

The backend object (load), the lowering (the manifest's ops) and plan ask the same answer here.
Asking is cheap: it reads the build's stamp file and never imports llama_cpp; only
`library_for` opens the GGUF's keys, and only when the build exists.
"""

from __future__ import annotations

import os
from pathlib import Path


def patched_library_dir() -> Path | None:
    """The InfLLM v2 libllama's folder, unless ARKINFER_LLAMACPP=upstream."""
    from .llamacpp_build import patched_library_dir as built

    return None if os.environ.get("ARKINFER_LLAMACPP") == "upstream" else built()


def infllmv2_built() -> bool:
    """True when the Runner will run InfLLM v2 (sparse_config GGUFs) on this machine."""
    return patched_library_dir() is not None


def has_sparse_config(gguf_path: Path) -> bool:
    """True when the file carries InfLLM v2 keys (`<arch>.attention.indexer.block_size`)."""
    import gguf

    if not gguf_path.is_file():
        return False
    reader = gguf.GGUFReader(gguf_path)
    return any(k.endswith(".attention.indexer.block_size") for k in reader.fields)


def library_for(gguf_path: Path) -> Path | None:
    """The patched library for a sparse GGUF when it is built; None: upstream llama.cpp."""
    lib = patched_library_dir()  # the cheap check first: the keys are read only when built
    return lib if lib is not None and has_sparse_config(gguf_path) else None
