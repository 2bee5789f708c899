"""What machine a benchmark ran on: re-exported from arkinfer.targets.machine for the scripts here."""

from arkinfer.targets.machine import cpu_model, machine_info

__all__ = ["cpu_model", "machine_info"]
