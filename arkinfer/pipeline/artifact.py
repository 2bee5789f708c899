"""Open a built artifact: its manifest, its backend, its Runner, and the full `verify` check.

    manifest = read_manifest(path)                 # schema version + JSON schema
    runner = load_runner(path)                     # hashes checked first
    report = verify_artifact(path)                 # integrity + parity vs the float source

Nothing the manifest says about quality is trusted: verify re-measures parity with the scheme's
thresholds. Without a signature it cannot prove who built the artifact or that the scheme it names
is the one used (see docs/safety.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from arkinfer.backend import get_backend

from . import manifest as mf
from .verify import VerifyError, recorded_mismatches


def is_artifact(path: str | Path) -> bool:
    return (Path(path) / mf.MANIFEST_NAME).is_file()


def check_integrity(path: Path, manifest: dict[str, Any], step=None) -> None:
    problems = mf.check_files(path, manifest, step)
    if problems:
        raise VerifyError(f"artifact {path} does not match its manifest: " + "; ".join(problems),
                          hint="the artifact was changed or damaged after the build; rebuild it "
                          "with `arkinfer build`")


def load_runner(path: str | Path, *, check: bool = True, step=None, bench: bool = False):
    """(manifest, Runner) of the artifact at `path`; with `check` the file hashes are verified.
    `bench=True` asks backends that support it for a runner tuned for timing (e.g. llama.cpp
    without all-position logits, like llama-bench)."""
    path = Path(path)
    manifest = mf.read_manifest(path)
    if check:
        check_integrity(path, manifest, step)
    backend = get_backend(manifest["backend"]["name"])
    if not backend.available():
        from arkinfer.errors import NotAvailableError

        raise NotAvailableError(f"artifact {path.name} needs backend "
                                f"{backend.name!r}, which is not installed",
                                hint=backend.install_hint())
    return manifest, backend.load(path, manifest, bench=bench)


def verify_artifact(path: str | Path, *, overrides: dict[str, float] | None = None,
                    source: str | Path | None = None, step=None) -> dict[str, Any]:
    """Schema, hashes, then parity re-measured against the float source (the manifest's path
    unless `source`). The thresholds are the scheme's (pipeline/verify.py) with `overrides`; the
    ones the manifest records are never used, and the result lists where the manifest's recorded
    metrics differ from the re-measured ones (`recorded_mismatches`)."""
    from .verify import backend_fidelity, verify_runner

    path = Path(path)
    manifest, runner = load_runner(path, step=step)
    src = float_source(path, manifest, source)
    try:
        recipe = mf.recipe_of(manifest)
    except (TypeError, ValueError) as exc:
        raise mf.ManifestError(f"quant.recipe in {path / mf.MANIFEST_NAME} is not a recipe: {exc}",
                               hint="the manifest was edited or damaged; rebuild the artifact"
                               ) from None
    step = step or (lambda m: None)
    result = verify_runner(runner, src, recipe, str(manifest["quant"].get("dtype", "f32")),
                           overrides or {}, step)
    fidelity = backend_fidelity(get_backend(manifest["backend"]["name"]), path, runner, step)
    if fidelity is not None:
        result["fidelity"] = fidelity
        if not fidelity["passed"]:
            result["passed"] = False
            result["failures"].append(fidelity["failure"])
    recorded = manifest["verification"]
    result["recorded_mismatches"] = recorded_mismatches(recorded["metrics"], result["metrics"],
                                                        recorded["thresholds"])
    if recorded["thresholds"] != result["thresholds"]:
        result["manifest_thresholds_ignored"] = recorded["thresholds"]
    result["artifact"] = str(path)
    result["source"] = {"path": str(src), "chosen_by": "--source" if source is not None
                        else "the manifest"}
    result["integrity"] = f"{len(manifest['files'])} files match the manifest"
    return result


def float_source(path: Path, manifest: dict[str, Any], source: str | Path | None) -> Path:
    """The float checkpoint to compare with: `source`, else the manifest's source path. It must
    hold the config.json the artifact was built from and must not lie inside the artifact (an
    artifact compared with its own files proves nothing)."""
    from arkinfer.errors import CheckpointError

    src = Path(source) if source is not None else Path(manifest["source"]["path"])
    if not (src / "config.json").is_file():
        raise CheckpointError(f"the artifact's float source {src} is not here",
                              hint="pass --source FOLDER with the checkpoint it was built from")
    if src.resolve().is_relative_to(path.resolve()):
        raise VerifyError(f"the float source {src} lies inside the artifact {path}; comparing the "
                          "artifact with its own files proves nothing",
                          hint="pass --source FOLDER with the float checkpoint it was built from")
    config_sha = mf.sha256_file(src / "config.json")
    if config_sha != manifest["source"]["config_sha256"]:
        raise VerifyError(f"{src}/config.json differs from the one {path.name} was built from "
                          f"(sha256 {config_sha[:12]} vs {manifest['source']['config_sha256'][:12]})",
                          hint="pass --source with the checkpoint the artifact was built from")
    return src
