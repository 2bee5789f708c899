"""Import a GGUF file (llama.cpp) into a Hugging Face model folder.

    import_gguf("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-hf")

writes config.json, model.safetensors (or shards + model.safetensors.index.json), tokenizer.json,
tokenizer_config.json and generation_config.json. Every tensor is dequantised to float32 (then
stored as f32 / bf16 / f16), renamed to HF names and, for `llama` / `minicpm`, has llama.cpp's
q/k row permutation undone (gguf_model.py). The tokenizer is rebuilt from the GGUF vocabulary
(gguf_tokenizer.py) so it gives llama.cpp's ids.

The folder is written under a temporary name next to OUT_DIR and renamed into place at the end, so
a failure or Ctrl-C never leaves a half-written OUT_DIR. Peak memory is about one tensor.
"""

from __future__ import annotations

import json
import secrets
import shutil
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from arkinfer.errors import CheckpointError, GGUFError
from arkinfer.frontend import gguf_model, gguf_tokenizer
from arkinfer.frontend.gguf_reader import GGUFFile
from arkinfer.frontend.safetensors_io import read_metadata
from arkinfer.frontend.shard_writer import DTYPES, TensorSpec, WeightDtype, write_shards
from arkinfer.output_folder import (
    MARKER,
    OutputError,
    check_output,
    make_staging,
    remove_leftovers,
    replace_folder,
)
from arkinfer.owned_folder import file_hashes, record_files

ProgressFn = Callable[[int, int, str], None]
RECORD_NAME = "arkinfer_import.json"  # every file the import wrote, with its sha256
DEFAULT_SHARD_BYTES = 5 * 1000**3  # Hugging Face's save_pretrained default ("5GB")
IMPORTER_VERSION = "3"  # bump when the output of the same GGUF changes; caches compare it
_F16_MAX = 65504.0

__all__ = ["DEFAULT_SHARD_BYTES", "IMPORTER_VERSION", "ImportResult", "import_gguf"]


@dataclass(frozen=True)
class ImportResult:
    """What `import_gguf` wrote: the folder, its config and a summary for humans."""

    path: Path
    source: Path
    architecture: str  # GGUF general.architecture
    model_type: str  # HF model_type in config.json
    parameters: int
    layers: int
    dtype: WeightDtype
    files: list[str]
    bytes: int  # total size of the files written
    tokenizer: str  # e.g. "byte-level BPE (pre-tokenizer 'smollm'), 49152 tokens, 48900 merges"
    tied_embeddings: bool
    source_types: dict[str, int]  # ggml tensor types in the GGUF, e.g. {"Q4_1": 210, "F32": 61}
    config: dict[str, Any] = field(repr=False)


def imported_metadata(folder: Path) -> dict[str, str] | None:
    """The `arkinfer_*` metadata of the first safetensors shard of a folder this importer wrote
    (e.g. {"arkinfer_source": "gguf", "arkinfer_importer": "1", ...}); None for any other folder."""
    files = sorted(folder.glob("*.safetensors"))
    if not files or not (folder / "config.json").is_file():
        return None
    try:
        meta = read_metadata(files[0])
    except CheckpointError:
        return None
    if meta.get("arkinfer_source") != "gguf":
        return None
    return {k: v for k, v in meta.items() if k.startswith("arkinfer_")}


def import_record(folder: Path) -> dict[str, str | None] | None:
    """{relative path: sha256} of the files an import's `arkinfer_import.json` lists (itself with
    None); None for any other folder, or an import written before imports listed their files."""
    return record_files(folder / RECORD_NAME)


def _check_out_dir(out: Path, source: Path, force: bool) -> None:
    try:
        check_output(out, force=force, what=f"ArkInfer import of a GGUF file (with {RECORD_NAME})",
                     record=import_record,
                     protected=[(source, "the GGUF file being imported")])
    except OutputError as exc:
        raise GGUFError(exc.message, hint=exc.hint) from None


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _first_missing_ancestor(path: Path) -> Path | None:
    """The outermost folder of `path`'s parents that does not exist yet (removed on failure)."""
    missing = None
    for parent in [path.parent, *path.parent.parents]:
        if parent.exists():
            break
        missing = parent
    return missing


def import_gguf(gguf_path: str | Path, out_dir: str | Path, dtype: WeightDtype = "f32",
                force: bool = False, max_shard_bytes: int = DEFAULT_SHARD_BYTES,
                progress: ProgressFn | None = None) -> ImportResult:
    """Convert `gguf_path` into the Hugging Face folder `out_dir`; returns what was written.

    dtype: weight dtype of the safetensors ("f32" default, "bf16", "f16"). force: replace a
    non-empty `out_dir`. progress(done, total, name): called with (0, total, "") before the
    first tensor and after each tensor (HF name); the library itself never prints.
    Raises GGUFError (bad/truncated file, unsupported architecture or tokenizer, existing output).
    """
    if dtype not in DTYPES:
        raise GGUFError(f"weight dtype {dtype!r} is not supported",
                        hint=f"use one of: {', '.join(DTYPES)}")
    if max_shard_bytes <= 0:
        raise GGUFError(f"max_shard_bytes={max_shard_bytes} must be positive",
                        hint="use e.g. 5 GB (5_000_000_000)")
    out = Path(out_dir).expanduser().absolute()
    source = Path(gguf_path).expanduser()
    _check_out_dir(out, source, force)
    remove_leftovers(out)  # of an import killed with kill -9
    gguf = GGUFFile(source)
    spec = gguf_model.spec_from_gguf(gguf)
    plans = gguf_model.plan_tensors(gguf, spec)
    config = gguf_model.build_config(gguf, spec, DTYPES[dtype][2])
    tok = gguf_tokenizer.build_tokenizer(gguf, config["max_position_embeddings"])
    by_name = {p.hf_name: p for p in plans}
    specs = [TensorSpec(p.hf_name, p.shape) for p in plans]
    total = len(specs)

    def produce(ts: TensorSpec) -> np.ndarray:
        data = gguf_model.hf_tensor(gguf, by_name[ts.name])
        if dtype == "f16" and np.abs(data).max(initial=0.0) > _F16_MAX:
            raise GGUFError(f"tensor '{ts.name}' has values beyond float16's range "
                            f"(|x| up to {float(np.abs(data).max()):.4g} > {_F16_MAX})",
                            hint="import with --dtype bf16 or --dtype f32")
        return data

    done = 0

    def on_tensor(ts: TensorSpec) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total, ts.name)

    from arkinfer.disk_space import MARGIN_BYTES, check_free_disk

    check_free_disk(out, sum(ts.nbytes(dtype) for ts in specs) + MARGIN_BYTES,
                    f"importing {source.name} as {dtype} safetensors")
    created_parent = _first_missing_ancestor(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    # not mkdtemp: the folder keeps the user's umask permissions after the rename
    tmp = make_staging(out, "importing", f"-{secrets.token_hex(4)}")
    try:
        if progress is not None:
            progress(0, total, "")
        metadata = {"arkinfer_source": "gguf", "arkinfer_gguf_file": gguf.path.name,
                    "arkinfer_importer": IMPORTER_VERSION}
        files = write_shards(tmp, specs, produce, dtype, max_shard_bytes, metadata, on_tensor)
        _write_json(tmp / "config.json", config)
        _write_json(tmp / "generation_config.json", gguf_tokenizer.generation_config(config))
        tok.tokenizer.save(str(tmp / "tokenizer.json"))
        _write_json(tmp / "tokenizer_config.json", tok.tokenizer_config)
        files += ["config.json", "generation_config.json", "tokenizer.json",
                  "tokenizer_config.json"]
        size = sum((tmp / name).stat().st_size for name in files)
        _write_json(tmp / RECORD_NAME, {"source": gguf.path.name, "importer": IMPORTER_VERSION,
                                        "files": file_hashes(tmp, skip=(MARKER,))})
        replace_folder(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if created_parent is not None:
            shutil.rmtree(created_parent, ignore_errors=True)
        raise
    return ImportResult(
        path=out, source=gguf.path, architecture=gguf.arch, model_type=spec.model_type,
        parameters=sum(p.numel for p in plans), layers=config["num_hidden_layers"], dtype=dtype,
        files=files, bytes=size, tokenizer=tok.kind,
        tied_embeddings=bool(config["tie_word_embeddings"]),
        source_types=dict(Counter(t.type_name for t in gguf.tensors.values())), config=config)
