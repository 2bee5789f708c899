"""One queue per runner: a single worker thread runs every request's generation, one after another.

A runner holds one KV cache, so two generations cannot interleave on it; one thread also keeps
every runtime call on one thread. MLX needs that: its arrays belong to the thread's stream, so a
runner loaded on one thread fails on another ("There is no Stream(cpu, 0) in current thread");
load the runner through `call` so it is made on the worker thread too.
Each request therefore gets exactly the tokens it would get alone. At most `max_waiting` requests
wait behind the running one; the next is refused at once (`QueueFullError`, HTTP 429) rather than
left to time out.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from arkinfer.errors import ArkError

T = TypeVar("T")


class QueueFullError(ArkError):
    """Too many requests are already running or waiting for the runner."""


class RunnerQueue:
    """Runs jobs on one worker thread in arrival order; `admitted` counts the running job and
    the waiting ones (at most 1 + max_waiting)."""

    def __init__(self, max_waiting: int) -> None:
        self.max_waiting = max_waiting
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="arkinfer-runner")
        self._lock = threading.Lock()
        self._admitted = 0

    @property
    def admitted(self) -> int:
        return self._admitted

    def submit(self, job: Callable[[], T]) -> Future[T]:
        """Queue `job` (it runs on the worker thread); QueueFullError when 1 + max_waiting jobs
        are already admitted."""
        with self._lock:
            if self._admitted > self.max_waiting:
                raise QueueFullError(f"{self._admitted - 1} requests are already waiting for the "
                                     f"runner (the limit is {self.max_waiting}) behind the one "
                                     "it is running", hint="retry in a moment, or start the "
                                     "server with a larger --max-queue")
            self._admitted += 1
        return self._pool.submit(self._run, job)

    def call(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the worker thread now (outside the request limit) and return its result:
        for loading the runner on the thread that will run it."""
        return self._pool.submit(fn).result()

    def _run(self, job: Callable[[], T]) -> T:
        try:
            return job()
        finally:
            with self._lock:
                self._admitted -= 1

    def close(self) -> None:
        """Stop taking jobs; waiting ones are dropped, the running one finishes."""
        self._pool.shutdown(wait=False, cancel_futures=True)
