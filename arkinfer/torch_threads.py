"""torch on one thread for a while: `with one_torch_thread(): ...` sets torch's intra-op threads
to 1 and restores the previous count afterwards (also on an exception, or when a generator
holding it is closed). GPTQ's small matrices (quant/calib/gptq.py) and the draft's work beside a
runtime with threads of its own (arkinfer/speculative/engine.py) use it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
