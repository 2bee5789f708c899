"""Build llama.cpp with ArkInfer's InfLLM v2 patch set (`arkinfer doctor --build-llamacpp`).

The patches in `llamacpp_patch/*.patch` (applied in name order with `patch -p1`) are written against
the llama.cpp that llama-cpp-python PINNED_VERSION vendors; the build is:

    <cache>/llamacpp/<PINNED_VERSION>/
      llama_cpp_python-<v>.tar.gz   the sdist, fetched once by `pip download --no-binary :all:`
      src/                          its vendor/llama.cpp, patched in place
      build/                        CMake + Ninja/Make build tree (kept: a new patch rebuilds incrementally)
      lib/                          libllama.so + libggml*.so of the last good build, and
      lib/arkinfer-build.json       {"patches": <hash of the patch set>, "version": ..., "cmake_flags": [...]}

(<cache> = $ARKINFER_CACHE or ~/.cache/arkinfer.) A new patch set restores only the files the old
and new patches touch from the sdist before applying, so unchanged sources keep their timestamps
and CMake recompiles just what the patch changed. `lib/` is replaced only after a build succeeds,
so a failed build leaves the previous library (or none) and the dense runner untouched.

llama-cpp-python binds its library once, when `llama_cpp` is first imported (LLAMA_CPP_LIB_PATH is
read then), so the patched library runs in a child process (`subprocess_runner.py`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

from arkinfer.errors import ArkError, NotAvailableError

PINNED_VERSION = "0.3.36"
PATCH_DIR = Path(__file__).parent / "llamacpp_patch"
STAMP = "arkinfer-build.json"
VENDOR = f"llama_cpp_python-{PINNED_VERSION}/vendor/llama.cpp/"
# -march=native (GGML_NATIVE) compiles ggml's AMX kernels in on Xeons with AMX, and those crash
# (SIGSEGV in ggml_backend_amx_mul_mat) on the 2-core AMX-capable Xeon VM this project runs on; the
# AVX-512 / AVX2 paths stay native. The Makefile builds llama-cpp-python with the same flags.
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
CMAKE_FLAGS = ["-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON", "-DGGML_NATIVE=ON",
               f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}",
               "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_TOOLS=OFF",
               "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_COMMON=OFF", "-DLLAMA_CURL=OFF",
               "-DLLAMA_OPENSSL=OFF", "-DCMAKE_BUILD_RPATH=$ORIGIN"]


class LlamaCppBuildError(ArkError):
    """The patched llama.cpp could not be fetched, patched or built."""


def build_root() -> Path:
    from arkinfer.frontend.cache import cache_dir_path

    return cache_dir_path() / "llamacpp" / PINNED_VERSION


def patch_files() -> list[Path]:
    return sorted(PATCH_DIR.glob("*.patch"))


def patch_set_hash() -> str:
    """sha256 (16 hex digits) over the patch files' names and bytes."""
    h = hashlib.sha256()
    for p in patch_files():
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def touched_files(patches: list[Path]) -> list[str]:
    """Paths (relative to llama.cpp's root) that the `+++ b/...` lines of `patches` change."""
    out: set[str] = set()
    for p in patches:
        for line in p.read_text().splitlines():
            if line.startswith("+++ b/"):
                out.add(line[6:].split("\t")[0])
    return sorted(out)


def patched_library_dir() -> Path | None:
    """lib/ of a finished build of the current patch set, else None."""
    lib = build_root() / "lib"
    try:
        stamp = json.loads((lib / STAMP).read_text())
    except (OSError, ValueError):
        return None
    if (stamp.get("patches") != patch_set_hash() or stamp.get("cmake_flags") != CMAKE_FLAGS
            or not (lib / "libllama.so").is_file()):
        return None   # another patch set, or built with other flags (an AMX build): rebuild
    return lib


def require_patched_library() -> Path:
    lib = patched_library_dir()
    if lib is None:
        raise NotAvailableError("the InfLLM v2 build of llama.cpp is not built (or is older than "
                                "the patch set)", hint="arkinfer doctor --build-llamacpp")
    return lib


def _run(cmd: list[str], cwd: Path, log: Path, step: str) -> None:
    with open(log, "ab") as fh:
        fh.write(("\n$ " + " ".join(cmd) + "\n").encode())
        fh.flush()
        try:
            rc = subprocess.run(cmd, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT).returncode
        except FileNotFoundError:
            rc = 127
    if rc != 0:
        tail = log.read_text(errors="replace").splitlines()[-15:]
        raise LlamaCppBuildError(f"llama.cpp build step '{step}' failed (exit {rc}); last lines of "
                                 f"{log}:\n" + "\n".join(tail),
                                 hint="install cmake and a C++17 compiler (or fix the patch), then "
                                      "run `arkinfer doctor --build-llamacpp` again; the dense "
                                      "GGUF runner keeps working meanwhile")


def _sdist(root: Path, log: Path) -> Path:
    tar = root / f"llama_cpp_python-{PINNED_VERSION}.tar.gz"
    if not tar.is_file():
        _run([sys.executable, "-m", "pip", "download", f"llama-cpp-python=={PINNED_VERSION}",
              "--no-binary", ":all:", "--no-deps", "-d", str(root)],
             root, log, "pip download")
    if not tar.is_file():
        raise LlamaCppBuildError(f"pip did not leave {tar.name} in {root}",
                                 hint="check network access to PyPI")
    return tar


def _restore(tar: Path, src: Path, files: list[str] | None) -> None:
    """Extract vendor/llama.cpp (all of it, or just `files`) from the sdist into src."""
    with tarfile.open(tar) as tf:
        members = [m for m in tf.getmembers() if m.name.startswith(VENDOR) and m.isfile()]
        wanted = None if files is None else set(files)
        for m in members:
            rel = m.name[len(VENDOR):]
            if wanted is not None and rel not in wanted:
                continue
            target = src / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            with tf.extractfile(m) as fh, open(target, "wb") as out:
                shutil.copyfileobj(fh, out)


def build_patched_llamacpp(jobs: int = 2, progress: Callable[[str], None] | None = None) -> Path:
    """Fetch, patch and build; return lib/. A finished build of the current patch set is reused."""
    from arkinfer.frontend.cache import locked

    say = progress or (lambda _msg: None)
    root = build_root()
    root.mkdir(parents=True, exist_ok=True)
    with locked(root, "build"):
        done = patched_library_dir()
        if done is not None:
            say(f"reusing {done}")
            return done
        for tool in ("cmake", "patch"):
            if shutil.which(tool) is None:
                raise LlamaCppBuildError(f"'{tool}' is not on PATH; the llama.cpp build needs it",
                                         hint=f"install {tool} (e.g. apt-get install {tool}), then "
                                              "run `arkinfer doctor --build-llamacpp` again")
        log = root / "build.log"
        log.write_text("")
        say(f"fetching llama-cpp-python {PINNED_VERSION} (sdist) ...")
        tar = _sdist(root, log)
        src, build, state = root / "src", root / "build", root / "applied.json"
        patches = patch_files()
        try:
            before = json.loads(state.read_text())
        except (OSError, ValueError):
            before = None
        if before is None or not (src / "CMakeLists.txt").is_file():
            say("extracting vendor/llama.cpp ...")
            shutil.rmtree(src, ignore_errors=True)
            _restore(tar, src, None)
            before = {"files": []}
        state.unlink(missing_ok=True)
        _apply(tar, src, patches, sorted(set(before.get("files", [])) | set(touched_files(patches))),
               root / "stage", log, say)
        state.write_text(json.dumps({"patches": patch_set_hash(), "files": touched_files(patches)}))
        if not (build / "CMakeCache.txt").is_file():
            gen = ["-G", "Ninja"] if shutil.which("ninja") else []
            say("configuring (cmake) ...")
            _run(["cmake", "-S", str(src), "-B", str(build), *gen, *CMAKE_FLAGS], root, log, "cmake configure")
        say(f"building libllama with {jobs} jobs (first build ~5-15 min on 2 cores; log: {log}) ...")
        _run(["cmake", "--build", str(build), "--target", "llama", "-j", str(jobs)], root, log, "cmake build")
        return _install(build, root)


def _apply(tar: Path, src: Path, patches: list[Path], files: list[str], stage: Path, log: Path,
           say: Callable[[str], None]) -> None:
    """Patch pristine copies of `files` in `stage`, then copy into src only the files whose bytes
    changed (unchanged files keep their timestamps, so the build stays incremental)."""
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir()
    _restore(tar, stage, files)
    for p in patches:
        say(f"applying {p.name}")
        _run(["patch", "-p1", "--forward", "--batch", "-i", str(p)], stage, log, f"patch {p.name}")
    for rel in files:
        new, old = stage / rel, src / rel
        if not old.is_file() or old.read_bytes() != new.read_bytes():
            old.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(new, old)
    shutil.rmtree(stage, ignore_errors=True)


def _install(build: Path, root: Path) -> Path:
    """Copy the built shared libraries to lib/ (replaced as a whole, stamp written last)."""
    libs = [p for p in (build / "bin").glob("lib*.so*")] or list(build.rglob("lib*.so*"))
    if not any(p.name.startswith("libllama.so") for p in libs):
        raise LlamaCppBuildError(f"the build finished but no libllama.so is under {build}",
                                 hint=f"see {root / 'build.log'}; delete {build} and build again")
    tmp = root / "lib.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for p in libs:
        if p.is_file():
            shutil.copy2(p, tmp / p.name, follow_symlinks=True)
    (tmp / STAMP).write_text(json.dumps({"patches": patch_set_hash(), "version": PINNED_VERSION,
                                         "cmake_flags": CMAKE_FLAGS}))
    lib = root / "lib"
    shutil.rmtree(lib, ignore_errors=True)
    os.replace(tmp, lib)
    return lib
