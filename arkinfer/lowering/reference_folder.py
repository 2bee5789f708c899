"""A float32 Hugging Face folder holding an artifact's exact weights, written once into ArkInfer's
cache, for backends whose artifact the reference model cannot read as it is (MLX affine biases,
TVM's q4 words).

    folder = cached_reference_folder("mlx", artifact, [artifact / "config.json", *weight_files],
                                     raw_config, ("quantization", "quantization_config"),
                                     write_tensors)
    # -> <cache>/mlx-reference/<key>/: model*.safetensors (float32), config.json, tokenizer
    #    files, arkinfer_mlx_reference.json (written last: the folder is complete)

`write_tensors(out)` writes the dequantised tensors into `out` (`shard_writer.write_shards` with
`REFERENCE_SHARD_BYTES`, one tensor in memory at a time). The key is a SHA-256 of `version` and
the content of `key_files`, so an artifact rebuilt in place gets a new folder, and the folder is
named by content only (a build writes its artifact in a staging folder first). Concurrent callers
serialise on a lock file; a folder without its done file (an interrupted write) is rewritten.
verify then compares the backend's runtime with the reference model on the same weights, which
separates lowering / runtime error from quantisation error (`Backend.reference_weights`).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from arkinfer.frontend.cache import cache_dir_path, content_key, locked
from arkinfer.lowering.tokenizer_files import copy_tokenizer_files

REFERENCE_SHARD_BYTES = 2 << 30


def cached_reference_folder(kind: str, artifact: str | Path, key_files: Sequence[Path],
                            raw_config: dict[str, Any], drop_keys: tuple[str, ...],
                            write_tensors: Callable[[Path], None], version: str = "1") -> Path:
    """The folder `<cache>/<kind>-reference/<key>/` for `artifact`, written by `write_tensors`
    and completed here when missing (see the module docstring). `raw_config` is the artifact's
    config.json; its `drop_keys` (the artifact's quantisation entries) are left out of the
    folder's config.json, whose torch_dtype becomes float32. Bump `version` when what
    `write_tensors` writes changes."""
    artifact = Path(artifact)
    digest = hashlib.sha256(version.encode())
    for f in key_files:
        digest.update(f"{f.name}:{content_key(f)};".encode())
    out = cache_dir_path() / f"{kind}-reference" / digest.hexdigest()[:16]
    done = out / f"arkinfer_{kind}_reference.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    with locked(out.parent, f"{kind}-reference-{out.name}"):
        if done.is_file():
            return out
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        write_tensors(out)
        cfg = {k: v for k, v in raw_config.items() if k not in drop_keys}
        cfg["torch_dtype"] = "float32"
        (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
        copy_tokenizer_files(artifact, out)
        done.write_text(json.dumps({"artifact": str(artifact.resolve()), "version": version})
                        + "\n", encoding="utf-8")
    return out
