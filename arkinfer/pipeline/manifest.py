"""The artifact manifest `arkinfer.json`: what was built from what, how, and the hash of every file.

    write_manifest(folder, data)        # validates against manifest.schema.json first
    manifest = read_manifest(folder)    # schema version + JSON schema; ManifestError otherwise
    problems = check_files(folder, manifest)   # [] or ["model.gguf: sha256 differs ...", ...]

`files` maps every artifact file except the manifest itself (POSIX paths relative to the
artifact folder) to {"sha256", "bytes"}. A path read from a manifest must stay inside the artifact
folder (`arkinfer.paths.resolve_inside`: no absolute path, no `..`, no symlink leaving it) and only
regular files are opened, so an edited manifest cannot make ArkInfer read or hash other files.
The schema (arkinfer/pipeline/manifest.schema.json) documents every field; bump SCHEMA_VERSION
when a field changes meaning.
"""

from __future__ import annotations

import json
import stat
from functools import cache
from pathlib import Path
from typing import Any

from arkinfer.errors import ArkError
from arkinfer.output_folder import MARKER
from arkinfer.owned_folder import Entry, sha256_file, unlisted_entries, walk
from arkinfer.owned_folder import file_hashes as owned_file_hashes  # {rel: sha256}
from arkinfer.paths import require_regular_file, resolve_inside

MANIFEST_NAME = "arkinfer.json"
SCHEMA_VERSION = 1
SCHEMA_PATH = Path(__file__).with_name("manifest.schema.json")
# A manifest is a few KB to a few MB (one entry per quantised layer); anything larger is not one.
MAX_MANIFEST_BYTES = 64 << 20


class ManifestError(ArkError):
    """An artifact's manifest is missing, unreadable, of another schema, or does not match."""


@cache
def schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))


def file_hashes(folder: Path, progress=None) -> dict[str, dict[str, Any]]:
    """{relative path: {"sha256", "bytes"}} of every regular file under `folder` except the
    manifest and the staging marker (which leaves the folder before it becomes the artifact)."""
    hashes = owned_file_hashes(folder, skip=(MANIFEST_NAME, MARKER), progress=progress)
    return {rel: {"sha256": h, "bytes": (folder / rel).stat().st_size} for rel, h in hashes.items()}


def source_file_hashes(source: Path, progress=None) -> dict[str, str]:
    """{name: sha256} of every file at the top of a source model folder: the manifest's
    `source.files` (build writes it; `arkinfer matrix` compares it to decide a rebuild)."""
    out = {}
    for path in sorted(p for p in source.iterdir() if p.is_file()):
        if progress is not None:
            progress(f"hash {path.name}")
        out[path.name] = sha256_file(path)
    return out


def validate(data: dict[str, Any], where: str = "manifest") -> None:
    """Raise ManifestError listing every schema violation (JSON path and message)."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema())
    errors = sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
    if errors:
        lines = [f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
                 for e in errors[:10]]
        raise ManifestError(f"{where} does not match the arkinfer.json schema "
                            f"v{SCHEMA_VERSION}:\n  " + "\n  ".join(lines),
                            hint="rebuild the artifact with this ArkInfer (`arkinfer build`)")


def write_manifest(folder: Path, data: dict[str, Any]) -> Path:
    validate(data)
    path = folder / MANIFEST_NAME
    path.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
    return path


def read_manifest(folder: str | Path) -> dict[str, Any]:
    folder = Path(folder)
    path = folder / MANIFEST_NAME
    if not folder.is_dir():
        raise ManifestError(f"{folder} is not an artifact folder",
                            hint="give the folder `arkinfer build` wrote (it holds arkinfer.json)")
    if not path.exists():
        raise ManifestError(f"{folder} has no {MANIFEST_NAME}; it is not an ArkInfer artifact "
                            "(or its build did not finish)", hint="build it with `arkinfer build`")
    if path.is_symlink():  # it would vouch for files it does not sit beside
        raise ManifestError(f"{path} is a symlink; an artifact's manifest is a regular file in "
                            "the artifact folder", hint="rebuild the artifact with `arkinfer build`")
    require_regular_file(path, "the artifact manifest", ManifestError)
    if path.stat().st_size > MAX_MANIFEST_BYTES:
        raise ManifestError(f"{path} is {path.stat().st_size} bytes; a manifest is at most "
                            f"{MAX_MANIFEST_BYTES >> 20} MiB",
                            hint="the file is damaged or not a manifest; rebuild the artifact")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as exc:  # JSON, UTF-8, over-long integer literals
        raise ManifestError(f"{path} is not valid JSON: {str(exc)[:200]}",
                            hint="the file is damaged; rebuild the artifact") from None
    version = data.get("schema_version") if isinstance(data, dict) else None
    if version != SCHEMA_VERSION:
        raise ManifestError(f"{path} has schema_version {repr(version)[:60]}; this ArkInfer "
                            f"reads version {SCHEMA_VERSION}",
                            hint="rebuild the artifact with this ArkInfer, or use the ArkInfer "
                            "version that wrote it")
    validate(data, str(path))
    return data


def check_files(folder: Path, manifest: dict[str, Any], progress=None) -> list[str]:
    """Every difference between the artifact's files and the manifest's hashes, one line each."""
    problems = []
    expected = manifest["files"]
    for rel, info in expected.items():
        path = resolve_inside(folder, rel, f"the `files` list of {folder / MANIFEST_NAME}")
        try:
            st = path.stat()
        except FileNotFoundError:
            problems.append(f"{rel}: missing")
            continue
        except OSError as exc:
            problems.append(f"{rel}: cannot be read ({exc.strerror or exc})")
            continue
        if not stat.S_ISREG(st.st_mode):  # a FIFO would block the hash forever
            problems.append(f"{rel}: not a regular file")
            continue
        if progress is not None:
            progress(f"hash {rel}")
        if st.st_size != info["bytes"]:
            problems.append(f"{rel}: {st.st_size} bytes, manifest says {info['bytes']}")
        elif sha256_file(path) != info["sha256"]:
            problems.append(f"{rel}: sha256 differs from the manifest (the file was changed or "
                            "corrupted)")
    listed = {**expected, MANIFEST_NAME: None}
    problems += [f"{e.rel}: {_unlisted(e)}" for e in unlisted_entries(walk(folder), listed)]
    return problems


def _unlisted(entry: Entry) -> str:
    if entry.kind == "file":
        return "not listed in the manifest (added after the build)"
    return f"a {entry.kind} the manifest does not list (an artifact holds only listed files)"


def artifact_record(folder: Path) -> dict[str, str | None] | None:
    """{relative path: sha256} of the files `folder`'s manifest lists, the manifest itself with
    None; None when `folder` holds no valid manifest (output_folder's `record` for artifacts)."""
    try:
        manifest = read_manifest(folder)
    except ArkError:
        return None
    return {**{rel: info["sha256"] for rel, info in manifest["files"].items()}, MANIFEST_NAME: None}


def recipe_of(manifest: dict[str, Any]):
    """The QuantRecipe an artifact was built with (None for float builds)."""
    from arkinfer.quant.recipe import QuantRecipe

    fields = manifest["quant"]["recipe"]
    if fields is None:
        return None
    return QuantRecipe(**{**fields, "skip": tuple(fields.get("skip", ())),
                          "layers": tuple(tuple(pair) for pair in fields.get("layers", ()))})
