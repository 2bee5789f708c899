"""What a benchmark records about its CPU (arkinfer/targets/machine.py): the SIMD features kernels
dispatch on, read from /proc/cpuinfo's first CPU, x86 and Arm."""

from __future__ import annotations

from arkinfer.targets.machine import SIMD_FLAGS, cpu_features, machine_info

X86 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC
flags\t\t: fpu sse2 avx fma f16c avx2 bmi2 avx512f avx512bw avx512vl avx512_bf16 sha_ni
processor\t: 1
flags\t\t: fpu sse2 avx amx_tile
"""
ARM = """processor\t: 0
Features\t: fp asimd evtstrm aes crc32 asimddp sve i8mm bf16
"""


def test_x86_flags_of_the_first_cpu_in_simd_order(tmp_path):
    (tmp_path / "cpuinfo").write_text(X86)
    assert cpu_features(tmp_path / "cpuinfo") == ["avx2", "fma", "f16c", "avx512f", "avx512bw",
                                                  "avx512vl", "avx512_bf16"]


def test_arm_features(tmp_path):
    (tmp_path / "cpuinfo").write_text(ARM)
    assert cpu_features(tmp_path / "cpuinfo") == ["asimd", "asimddp", "sve", "i8mm", "bf16"]


def test_unreadable_or_flagless_cpuinfo_gives_no_features(tmp_path):
    assert cpu_features(tmp_path / "missing") == []
    (tmp_path / "cpuinfo").write_text("processor\t: 0\n")
    assert cpu_features(tmp_path / "cpuinfo") == []


def test_machine_info_records_this_cpus_features():
    info = machine_info(threads=2)
    assert set(info["cpu_features"]) <= set(SIMD_FLAGS) and info["threads"] == 2
