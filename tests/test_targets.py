"""Target profiles: every shipped file validates, names resolve, a bad file fails with one clear
error, derived numbers match their arithmetic, and `arkinfer targets` lists and shows them."""

from __future__ import annotations

import json
from importlib import resources

import pytest
import typer
from typer.testing import CliRunner

from arkinfer.cli import targets as targets_cli
from arkinfer.errors import TargetError
from arkinfer.targets import (
    KNOWN_BACKENDS,
    DeviceDType,
    Provenance,
    evaluate_derivation,
    index_targets,
    known_quant_formats,
    list_targets,
    load_target,
    load_target_file,
    resolve_id,
)

SHIPPED = {
    "jetson-agx-orin-64gb", "jetson-agx-orin-32gb", "jetson-orin-nx-16gb", "jetson-orin-nano-8gb",
    "rtx-4090", "apple-m4", "apple-m4-pro", "apple-m4-max", "iphone-15-pro", "android-sd8gen3",
    "rpi5-8gb", "host",
}


def _quantities(t):
    named = {"memory.total": t.memory, "bandwidth.peak": t.bandwidth,
             "bandwidth.sustained": t.sustained_bandwidth, "efficiency.bandwidth": t.eta_bw,
             "efficiency.compute": t.eta_c, **{f"compute.{k}": q for k, q in t.compute.items()}}
    return {k: q for k, q in named.items() if q is not None}


# --- shipped profiles -------------------------------------------------------------------------


def test_every_shipped_profile_loads():
    assert {t.id for t in list_targets()} == SHIPPED
    files = {e.name for e in resources.files("arkinfer.target_profiles").iterdir()}
    assert {f"{i}.toml" for i in SHIPPED} <= files


@pytest.mark.parametrize("tid", sorted(SHIPPED))
def test_profile_is_complete_and_in_vocabulary(tid):
    t = load_target(tid)
    assert t.default_backend in t.backends
    assert set(t.backends) <= set(KNOWN_BACKENDS)
    assert set(t.quant_formats) <= set(known_quant_formats())
    assert "gguf" in t.backends or t.id == "host" and "reference" in t.backends
    assert t.codegen.source
    for name, q in _quantities(t).items():
        assert q.source, name
        if q.provenance is Provenance.DERIVED:  # the loader checks this too; check it again here
            assert evaluate_derivation(q.derivation) == pytest.approx(q.value, rel=5e-3), name
        if q.provenance is Provenance.MEASURED:
            assert q.measurement, name
    if t.measured_at_runtime:
        assert t.memory is None and t.bandwidth is None and not t.compute
    else:
        assert t.memory.value > 0 and t.bandwidth.value > 0 and t.eta_bw and t.eta_c


@pytest.mark.parametrize("tid", sorted(SHIPPED))
def test_capability_gates_follow_the_hardware(tid):
    t = load_target(tid)
    arch = t.codegen.cuda_arch
    sm = int(arch.removeprefix("sm_")) if arch else 0
    cuda_formats = {"marlin", "gptq", "awq"}
    # reference and onnx run these layouts on any CPU (numpy unpack; ONNX functions/MatMulNBits);
    # mlx repacks gptq / awq codes to MLX affine, coreml to constexpr_blockwise_shift_scale
    # (no CUDA kernel involved)
    cpu_backends = {"reference", "onnx", "mlx", "coreml"}
    if any(cuda_formats & set(b.quant_formats) for n, b in t.backends.items()
           if n not in cpu_backends):
        assert sm >= 80, "Marlin/GPTQ/AWQ CUDA kernels need sm_80+"
    if DeviceDType.F8_E4M3 in t.dtypes or DeviceDType.F8_E5M2 in t.dtypes:
        assert sm >= 89, "FP8 tensor cores need sm_89+"
    if arch == "sm_87":
        assert "arch=compute_87,code=compute_87" in t.codegen.cuda_gencode  # ship PTX on Tegra
    if "mlx" in t.backends and t.id != "host":
        assert t.codegen.gpu_api == "metal"


def test_quant_formats_are_registered_formats():
    """The shipped profiles name only registered formats (the list comes from the registry)."""
    from arkinfer.quant.formats import all_formats

    assert set(known_quant_formats()) == {f.name for f in all_formats()}
    for t in list_targets():
        assert set(t.quant_formats) <= set(known_quant_formats()), t.id


def test_llama_cpp_devices_accept_gguf():
    for tid in ("rpi5", "android", "jetson-orin", "mac", "jetson-orin-nano", "host"):
        assert "gguf-q4_0" in load_target(tid).backend("gguf").quant_formats


def test_default_backends():
    expected = {"jetson-orin": "tensorrt", "rtx-4090": "tensorrt", "mac": "mlx", "iphone": "mlx",
                "android": "tvm", "rpi5": "gguf", "host": "gguf"}
    assert {name: load_target(name).default_backend for name in expected} == expected


def test_derived_numbers_match_their_arithmetic():
    assert load_target("android").bandwidth.value == pytest.approx(9600e6 * 64 / 8)  # 76.8 GB/s
    assert load_target("iphone").bandwidth.value == pytest.approx(6400e6 * 64 / 8)  # 51.2 GB/s
    rpi = load_target("rpi5")
    assert rpi.bandwidth.value == pytest.approx(4267e6 * 32 / 8)  # 17.1 GB/s
    assert rpi.compute["fp32"].value == pytest.approx(4 * 2.4e9 * 2 * 4 * 2)  # ~154 GFLOP/s
    assert rpi.eta_bw.value == pytest.approx(11.4 / 17.1, abs=0.01)
    orin = load_target("jetson-orin")
    assert orin.peak_compute.value == pytest.approx(170e12 / 4)  # 42.5 TFLOPS dense FP16
    assert orin.compute["int8"].value == pytest.approx(85e12)


def test_vendor_numbers_from_the_spec():
    gb = 1e9
    assert load_target("jetson-orin").bandwidth.value == 204.8 * gb
    assert load_target("jetson-orin-nano").bandwidth.value == 102 * gb
    assert load_target("rtx-4090").bandwidth.value == 1008 * gb
    assert [load_target(i).bandwidth.value / gb for i in ("apple-m4", "apple-m4-pro",
                                                          "apple-m4-max")] == [120, 273, 546]
    assert load_target("jetson-orin").memory.value == 64 * 2**30
    assert load_target("jetson-orin-nano").eta_bw.value == 0.79


# --- names ------------------------------------------------------------------------------------


@pytest.mark.parametrize("alias,tid", [
    ("jetson-orin", "jetson-agx-orin-64gb"), ("rpi5", "rpi5-8gb"), ("android", "android-sd8gen3"),
    ("jetson-orin-nano", "jetson-orin-nano-8gb"), ("iphone", "iphone-15-pro"), ("mac", "apple-m4"),
    ("RPi5", "rpi5-8gb"), ("rtx-4090", "rtx-4090"),
])
def test_aliases_resolve(alias, tid):
    assert resolve_id(alias) == tid
    assert load_target(alias).id == tid


def test_unknown_id_lists_known_ids_and_suggests():
    with pytest.raises(TargetError) as exc:
        load_target("jetson-orn")
    for tid in SHIPPED:
        assert tid in exc.value.message
    assert "jetson-orin" in exc.value.message and "did you mean 'jetson-orin'" in exc.value.hint


def test_alias_collision_is_an_error(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text(_rpi5_text().replace('id = "rpi5-8gb"', 'id = "my-pi"'))
    with pytest.raises(TargetError, match="'rpi5' is already taken by target 'rpi5-8gb'"):
        index_targets([load_target("rpi5"), load_target_file(path)])


# --- user files -------------------------------------------------------------------------------


def _rpi5_text() -> str:
    return (resources.files("arkinfer.target_profiles") / "rpi5-8gb.toml").read_text("utf-8")


def test_user_profile_by_path(tmp_path):
    path = tmp_path / "board.toml"
    path.write_text(_rpi5_text().replace('id = "rpi5-8gb"', 'id = "my-board"')
                    .replace('aliases = ["rpi5"]', 'aliases = []'))
    assert load_target(str(path)).id == "my-board"
    assert load_target_file(path).bandwidth.value == pytest.approx(17.068e9)


@pytest.mark.parametrize("old,new,expected", [
    ('provenance = "derived"\nderivation = "4267e6 * 32 / 8"\n', "",
     r"table 'bandwidth.peak': missing key 'provenance'"),
    ('[bandwidth.peak]\n', '[bandwidth.peak]\nbogus = 1\n',
     r"table 'bandwidth.peak': unknown key 'bogus'; allowed: derivation, measurement"),
    ("cpu_cores = 4", 'cpu_cores = "four"', r"table 'codegen': cpu_cores = 'four' must be int"),
    ("value = 153.6e9", "value = 200e9", r"derivation '4 \* 2.4e9 \* 2 \* 4 \* 2' = 1.536e\+11"),
    ('derivation = "4267e6 * 32 / 8"', 'derivation = "__import__(\'os\')"', "is not arithmetic"),
    ('provenance = "vendor"', 'provenance = "datasheet"',
     "provenance = 'datasheet' is not one of vendor, derived, measured, assumed"),
    ('measurement = "sustained', 'note = "sustained', r"unknown key 'note'"),
    ('default_backend = "gguf"', 'default_backend = "tvm"', "has no backends.tvm table"),
    ('dtypes = ["f32", "f16", "i8"]', 'dtypes = ["f32", "fp16"]', "'fp16' is not a dtype"),
    ("schema = 1", "schema = 2", "schema = 2 is not supported"),
    ('roofline = "fp32"', 'roofline = "fp16"', "roofline = 'fp16' names no entry"),
    ("value = 0.67", "value = 1.5", r"value = 1.5 must be in \(0, 1\]"),
    ("[memory.total]", "[memory.total", "not valid TOML"),
])
def test_malformed_user_profile_gives_one_clear_error(tmp_path, old, new, expected):
    text = _rpi5_text()
    assert old in text
    path = tmp_path / "bad.toml"
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(TargetError, match=expected) as exc:
        load_target_file(path)
    assert str(path) in exc.value.message and exc.value.hint


def test_missing_file_is_a_target_error(tmp_path):
    with pytest.raises(TargetError, match="cannot read target profile"):
        load_target(str(tmp_path / "nope.toml"))


# --- behaviour --------------------------------------------------------------------------------


def test_check_gates_backend_format_and_dtype():
    orin = load_target("jetson-orin")
    assert orin.check(quant_format="marlin").name == "tensorrt"
    assert orin.check("gguf", "gguf-q4_0", "f16").name == "gguf"
    with pytest.raises(TargetError, match="'gguf-q4_0' is not allowed for backend 'tensorrt'") as exc:
        orin.check(quant_format="gguf-q4_0")
    assert "--backend gguf" in exc.value.hint
    with pytest.raises(TargetError, match="dtype 'f8_e4m3'"):
        orin.check(dtype="f8_e4m3")
    assert load_target("rtx-4090").check(dtype="f8_e4m3").name == "tensorrt"
    with pytest.raises(TargetError, match="backend 'tensorrt' is not allowed on target 'rpi5-8gb'"):
        load_target("rpi5").check("tensorrt")


def test_host_filled_in_by_measurement():
    host = load_target("host").with_measured("doctor: stream copy + sgemm", memory_bytes=16 * 2**30,
                                             bandwidth=20e9, compute={"fp32": 5e11},
                                             roofline="fp32")
    assert host.bandwidth.provenance is Provenance.MEASURED and host.peak_compute.value == 5e11
    assert load_target("host").bandwidth is None  # the shipped profile is untouched


def test_evaluate_derivation_is_arithmetic_only():
    assert evaluate_derivation("9600e6 * 64 / 8") == 76.8e9
    assert evaluate_derivation("64 * 2**30") == 64 * 2**30
    for bad in ("x * 2", "open('f')", "2 ** 1000", "1 / 0", "[1]"):
        with pytest.raises(ValueError):
            evaluate_derivation(bad)


# --- CLI --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cli():
    root = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    root.callback()(lambda: None)
    root.add_typer(targets_cli.app, name="targets")
    runner = CliRunner()
    return lambda *args: runner.invoke(root, ["targets", *args], env={"COLUMNS": "200"})


def test_cli_module_conventions():
    assert targets_cli.HELP and all(e.startswith("arkinfer targets") for e in targets_cli.EXAMPLES)


def test_cli_list(cli):
    result = cli()
    assert result.exit_code == 0, result.output
    for text in ("jetson-agx-orin-64gb", "jetson-orin", "204.8 GB/s", "tensorrt", "rpi5-8gb"):
        assert text in result.stdout


def test_cli_list_json(cli):
    result = cli("--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert {d["id"] for d in data} == SHIPPED
    android = next(d for d in data if d["id"] == "android-sd8gen3")
    assert android["bandwidth"]["peak"] == {"value": 76.8e9, "provenance": "derived",
                                            "derivation": "9600e6 * 64 / 8",
                                            "source": android["bandwidth"]["peak"]["source"]}


def test_cli_show(cli):
    result = cli("show", "jetson-orin")
    assert result.exit_code == 0, result.output
    for text in ("jetson-agx-orin-64gb", "42.5 TFLOP/s", "170e12 / 2 / 2", "derived", "vendor",
                 "measured", "assumed", "sm_87", "marlin"):
        assert text in result.stdout, text


def test_cli_show_json(cli):
    result = cli("show", "rpi5", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["id"] == "rpi5-8gb" and data["compute"]["roofline"] == "fp32"
    assert data["efficiency"]["bandwidth"]["provenance"] == "measured"


def test_cli_unknown_target_is_error_and_hint(cli):
    result = cli("show", "jetson-orn")
    assert result.exit_code == 1
    assert "error:" in result.stderr and "hint:" in result.stderr
    assert "did you mean 'jetson-orin'" in result.stderr and "Traceback" not in result.output


def test_cli_bad_user_file_names_the_table(cli, tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(_rpi5_text().replace('provenance = "vendor"', 'provenance = "datasheet"', 1))
    result = cli("show", str(path))
    assert result.exit_code == 1
    assert "table 'memory.total': provenance = 'datasheet' is not one of" in result.stderr


def test_cli_prints_profile_text_verbatim(cli):
    result = cli("show", "host")
    assert result.exit_code == 0, result.output
    assert "(the [gguf] extra)" in result.stdout  # brackets are text, not rich markup
    assert "arkinfer doctor" in result.stdout


_MEASURE_CONCURRENTLY = """
import pathlib, sys, time
import arkinfer.targets.host as host
host.measure_host = lambda: {"by": sys.argv[1]}
rename = pathlib.Path.replace
def slow_rename(self, target):   # widen the window between writing and renaming
    time.sleep(0.3)
    return rename(self, target)
pathlib.Path.replace = slow_rename
time.sleep(float(sys.argv[2]))
print(host.host_measurement(remeasure=True)["by"])
"""


def test_two_processes_measuring_the_host_at_once_both_succeed(tmp_path):
    """A matrix runs cells side by side, and each may (re)measure the host: every writer renames a
    complete file of its own into place, none loses its temporary to the other."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "ARKINFER_CACHE": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", _MEASURE_CONCURRENTLY, name, delay],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name, delay in (("a", "0"), ("b", "0.05"))]
    results = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results
    assert sorted(out.strip() for out, _ in results) == ["a", "b"]
    (cached,) = tmp_path.glob("host-*t.json")
    assert json.loads(cached.read_text())["by"] in ("a", "b")
    # no temporary left behind (the measurement's lock file stays, as lock files do)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".host.lock", cached.name]


def test_another_thread_count_keeps_its_own_host_record(tmp_path, monkeypatch):
    """`OMP_NUM_THREADS=1 arkinfer ...` measures its own record and leaves the default's alone."""
    import torch

    from arkinfer.targets import host

    monkeypatch.setenv("ARKINFER_CACHE", str(tmp_path))
    monkeypatch.setattr(host, "measure_host", lambda: {"version": host.VERSION, "cpu":
                        host.cpu_model(), "threads": torch.get_num_threads()})
    threads = torch.get_num_threads()
    default = host.host_measurement()
    try:
        torch.set_num_threads(threads + 1)
        other = host.host_measurement()
    finally:
        torch.set_num_threads(threads)
    assert (default["threads"], other["threads"]) == (threads, threads + 1)
    assert host.load_cached() == default
    assert sorted(p.name for p in tmp_path.glob("host-*")) == sorted(
        [f"host-{threads}t.json", f"host-{threads + 1}t.json"])
