"""What machine a benchmark ran on: re-exported from arkinfer.machine for the scripts here."""

from arkinfer.machine import cpu_model, machine_info

__all__ = ["cpu_model", "machine_info"]
