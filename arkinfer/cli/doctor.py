"""`arkinfer doctor` — what this installation can do, and this machine's roofline numbers.

Lists the registered backends (usable here or not, with the install command), the versions of
the toolchains ArkInfer uses (the core's and the packages each backend's capabilities declare),
and the host's copy bandwidth, fp32 matmul rate and memory, measured once and cached
(arkinfer/targets/host.py) for `host` predictions in plan, build and bench. `--build-FLAG`
builds the optional runtime a backend's capabilities declare (`OptionalRuntime.flag`).
"""

from __future__ import annotations

import platform
from importlib import metadata
from typing import Annotated, Any

import typer

from arkinfer import __version__
from arkinfer.backend import Backend, OptionalRuntime, backend_names, get_backend
from arkinfer.cli._errors import handle_errors
from arkinfer.cli._options import JsonOpt
from arkinfer.cli._output import console, print_json, print_kv, print_table, terminal_safe
from arkinfer.errors import NotAvailableError

HELP = ("Check this installation: registered backends and whether their toolchains are "
        "installed (with the install command), package versions, and this machine's copy "
        "bandwidth and matmul rate, measured once and cached for host latency predictions.")
EXAMPLES = ["arkinfer doctor", "arkinfer doctor --remeasure", "arkinfer doctor --json",
            "arkinfer doctor --build-llamacpp"]

# distribution -> what ArkInfer uses it for, outside the backends (each backend's packages are
# its capabilities': `Capabilities.packages`)
CORE_PACKAGES = {
    "torch": "reference models, IR, host runner",
    "numpy": "format packers / unpack references",
    "safetensors": "checkpoints",
    "tokenizers": "tokenizers",
}
TOOL_PACKAGES = {
    "transformers": "parity tests ([dev])",
    "matplotlib": "bench --plot ([plot])",
}


def packages() -> dict[str, str]:
    """distribution -> what it is used for: the core, every registered backend's declared
    packages ('onnx, tensorrt backends graph ([onnx])'), then the test and plot extras."""
    uses: dict[str, dict[str, list[str]]] = {}  # dist -> use -> backends
    extra: dict[str, str | None] = {}
    for name in backend_names():
        caps = get_backend(name).capabilities
        for dist, use in caps.packages.items():
            uses.setdefault(dist, {}).setdefault(use, []).append(name)
            extra.setdefault(dist, caps.extra)
    declared = {}
    for dist, by_use in uses.items():
        words = "; ".join(f"{', '.join(names)} backend{'s' if len(names) > 1 else ''}"
                          + (f" {use}" if use else "") for use, names in by_use.items())
        declared[dist] = words + (f" ([{extra[dist]}])" if extra[dist] else "")
    return {**CORE_PACKAGES, **declared, **TOOL_PACKAGES}


def package_versions(dists: dict[str, str]) -> dict[str, str | None]:
    """Installed version of every distribution in `dists` (None when absent)."""
    out: dict[str, str | None] = {}
    for dist in dists:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def backends() -> list[dict[str, Any]]:
    """Registered backends: available here, install hint, targets using it by default."""
    from arkinfer.backend import backend_status
    from arkinfer.targets import list_targets

    defaults: dict[str, list[str]] = {}
    for t in list_targets():
        defaults.setdefault(t.default_backend, []).append(t.id)
    return [{"name": s.name, "available": s.available, "install_hint": s.install_hint,
             "default_for": defaults.get(s.name, [])} for s in backend_status()]


def command(
    remeasure: Annotated[bool, typer.Option("--remeasure", help="Measure bandwidth and matmul "
                                            "rate again instead of using the cache.")] = False,
    json_out: JsonOpt = False,
    build_llamacpp: Annotated[bool, typer.Option(
        "--build-llamacpp", help="Build llama.cpp with ArkInfer's InfLLM v2 patch "
        "(pip-downloads the pinned llama-cpp-python sdist, patches it, builds libllama with CMake "
        "into the cache; reused once built). GGUF artifacts of MiniCPM4 with a sparse_config then "
        "run sparse.")] = False,
) -> None:
    """Backends, toolchains and this machine's measured numbers."""
    if build_llamacpp:
        build_patched(json_out)
        return
    run(remeasure, json_out)


def runtime_backend(flag: str) -> tuple[Backend, OptionalRuntime]:
    """The registered backend whose capabilities declare the runtime `--build-FLAG` builds."""
    declared = []
    for name in backend_names():
        backend = get_backend(name)
        runtime = backend.capabilities.runtime
        if runtime is not None and runtime.flag == flag:
            return backend, runtime
        declared += [f"--build-{runtime.flag} ({name})"] if runtime is not None else []
    raise NotAvailableError(f"no registered backend declares a runtime for --build-{flag}",
                            hint=f"runtimes declared: {', '.join(declared) or 'none'}")


@handle_errors
def build_patched(json_out: bool, flag: str = "llamacpp") -> None:
    """`--build-llamacpp`: build (or reuse) the runtime a backend declares for `flag` (the gguf
    backend's InfLLM v2 llama.cpp) and say where it is (`Backend.build_runtime`)."""
    backend, runtime = runtime_backend(flag)
    say = None if json_out else (lambda msg: console.print(terminal_safe(msg, keep="\n"),
                                                         markup=False))
    info = backend.build_runtime(progress=say)
    if json_out:
        print_json(info)
        return
    print_kv(runtime.title, [(k.replace("_", " "), v) for k, v in info.items()])


@handle_errors
def run(remeasure: bool, json_out: bool) -> None:
    from arkinfer.targets.host import cache_path, host_measurement, load_cached

    cached = None if remeasure else load_cached()
    if cached is None and not json_out:
        console.print("measuring this machine (copy bandwidth, matmul rate) ...", markup=False)
    record = host_measurement(measure_if_missing=True, remeasure=remeasure)
    from arkinfer.huge_pages import status as huge_page_status
    from arkinfer.ops.infllmv2.native import describe
    from arkinfer.targets.machine import cpu_features

    used_for = packages()
    info = {"arkinfer": __version__, "python": platform.python_version(),
            "platform": platform.platform(), "backends": backends(),
            "packages": package_versions(used_for),
            "host": {**record, "cache": str(cache_path()), "from_cache": cached is not None},
            "cpu_features": cpu_features(),
            "infllmv2_decode": describe(), "huge_page_malloc": huge_page_status()}
    if json_out:
        print_json(info)
        return
    print_kv("arkinfer doctor", [("arkinfer", __version__), ("python", info["python"]),
                                 ("platform", info["platform"])])
    print_table("backends", ["backend", "usable here", "default for", "install"],
                [[b["name"], "yes" if b["available"] else "no", ", ".join(b["default_for"]) or "-",
                  "-" if b["available"] else b["install_hint"]] for b in info["backends"]])
    print_table("packages", ["package", "version", "used for"],
                [[d, v or "not installed", used_for[d]] for d, v in info["packages"].items()])
    h = info["host"]
    print_kv("this machine (the `host` target)", [
        ("cpu", (f"{h['cpu']} ({' '.join(info['cpu_features']) or 'SIMD features unknown'}), "
                 f"{h['threads']} torch threads")),
        ("memory", f"{h['memory_bytes'] / 2**30:.3g} GiB"),
        ("copy bandwidth", (f"{h['copy_bandwidth_bytes_s'] / 1e9:.3g} GB/s "
                           f"({h['method']['copy_bandwidth']})")),
        ("fp32 matmul", f"{h['matmul_fp32_flop_s'] / 1e9:.3g} GFLOP/s ({h['method']['matmul']})"),
        ("measured", (f"{h['date']} ({'cached' if h['from_cache'] else 'now'}: {h['cache']}; "
                     "--remeasure to redo)")),
        ("InfLLM v2 decode", _decode_words(info["infllmv2_decode"])),
        ("huge-page malloc", _huge_page_words(info["huge_page_malloc"])),
    ])


def _decode_words(d: dict[str, Any]) -> str:
    """One line for `describe()`'s record."""
    if d["path"] != "C kernel":
        return f"pure torch ({d['why']})"
    parts = ["C kernel", "torch's OpenMP threads" if d["openmp"] else "one thread",
             "AVX-512 tiles" if d["avx512"] else "AVX2 tiles"]
    if d["amx_bf16"]:
        parts.append("AMX tiles for bf16 caches (ARKINFER_AMX=0: off)")
    return ", ".join(parts)


def _huge_page_words(d: dict[str, Any]) -> str:
    """One line for `huge_pages.status()`'s record."""
    return f"on: {d['why']} (ARKINFER_HUGE_PAGES=0: off)" if d["on"] else f"off: {d['why']}"
