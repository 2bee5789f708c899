"""arkinfer/huge_pages.py: the environment it builds, and (where this machine allows it) that a
restarted process really gets 2 MiB pages, by the kernel's own count (AnonHugePages)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from arkinfer import huge_pages as hp

APPLIES = hp.huge_page_env({}) is not None
# not Linux, glibc before 2.35, or transparent huge pages absent / set to never on this machine
needs_huge_pages = pytest.mark.skipif(
    not APPLIES, reason=f"huge-page malloc does not apply here: {hp.status({})['why']}")


@needs_huge_pages
def test_env_adds_the_tunable_and_keeps_the_users_others():
    assert hp.huge_page_env({})["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"
    env = hp.huge_page_env({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    assert hp.status(env)["on"]


@pytest.mark.parametrize("env, why", [
    ({"ARKINFER_HUGE_PAGES": "0"}, "ARKINFER_HUGE_PAGES=0"),
    ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, "already sets"),
])
def test_env_leaves_an_explicit_choice_alone(env, why):
    assert hp.huge_page_env(env) is None
    assert not hp.status(env)["on"] and why in hp.status(env)["why"]


def test_without_removes_only_the_tunable():
    env = {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1",
           "ARKINFER_HUGE_PAGES_REEXEC": "1", "HOME": "/root"}
    out = hp.without_huge_page_malloc(env)
    assert out == {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2", "HOME": "/root"}
    assert "GLIBC_TUNABLES" not in hp.without_huge_page_malloc(
        {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"})


_CHILD = """
import json, os, sys
from arkinfer.huge_pages import reexec_with_huge_page_malloc, status
reexec_with_huge_page_malloc()
import numpy as np
a = np.ones(64 * 2**20 // 8)          # 64 MiB, touched: malloc maps it, the kernel backs it
rollup = {l.split(':')[0]: int(l.split()[1]) for l in open('/proc/self/smaps_rollup')
          if l.split()[-1] == 'kB'}
print(json.dumps({"argv": sys.argv[1:], "on": status()["on"],
                  "anon_huge_kib": rollup.get("AnonHugePages", 0), "sum": float(a.sum())}))
"""


def _child(env_extra: dict[str, str]) -> dict:
    env = hp.without_huge_page_malloc()
    env.update(env_extra)
    done = subprocess.run([sys.executable, "-c", _CHILD, "--flag", "x y"], capture_output=True,
                          text=True, env=env, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


@needs_huge_pages
def test_a_restarted_process_gets_huge_pages_and_the_same_arguments():
    on = _child({})
    assert on["on"] and on["argv"] == ["--flag", "x y"] and on["sum"] == 64 * 2**20 // 8
    assert on["anon_huge_kib"] >= 32 * 1024, on      # most of the 64 MiB on 2 MiB pages
    off = _child({"ARKINFER_HUGE_PAGES": "0"})
    assert not off["on"] and off["argv"] == ["--flag", "x y"]
    assert off["anon_huge_kib"] < on["anon_huge_kib"], (off, on)
