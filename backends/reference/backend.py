"""The reference backend (target `host`): the quantised HF folder run by ArkInfer's PyTorch
reference model on this CPU."""

from __future__ import annotations


class ReferenceBackend:
    name = "reference"

    def available(self) -> bool:
        return True

    def install_hint(self) -> str:
        return "always available (part of the core install)"


BACKEND = ReferenceBackend()
