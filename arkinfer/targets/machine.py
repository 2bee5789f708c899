"""What machine a build, benchmark or bench result ran on (recorded beside every number)."""

from __future__ import annotations

import os
import platform
from pathlib import Path

from arkinfer.huge_pages import status


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (platform.processor() elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info(**extra: object) -> dict[str, object]:
    """cpu, cores, python and torch versions, whether malloc asks for huge pages
    (arkinfer/huge_pages.py), plus any `extra` fields (e.g. threads)."""
    import torch

    return {"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(),
            "torch": torch.__version__, "huge_page_malloc": status()["on"], **extra}
