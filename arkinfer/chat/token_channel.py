"""Tokens from the runner's worker thread to the asyncio request that waits for them.

    channel = TokenChannel(asyncio.get_running_loop())
    queue.submit(lambda: produce(channel))        # worker: channel.put(token) ... channel.end()
    async for token in channel: ...               # the request, on the event loop
    channel.cancel()                              # the client went away: the worker stops

The worker hands each item to the loop with `call_soon_threadsafe`, so the loop never blocks
on the worker and no thread waits on the loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

_END = object()


class TokenChannel:
    """Items: token ids, then the end or the exception that stopped generation."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: asyncio.Queue[object] = asyncio.Queue()
        self._cancelled = threading.Event()

    # ---- the worker thread's side
    def put(self, token: int) -> None:
        self._send(token)

    def end(self, error: BaseException | None = None) -> None:
        self._send(_END if error is None else error)

    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def _send(self, item: object) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop has closed (server shutting down): nobody listens
            self._cancelled.set()

    # ---- the request's side
    def cancel(self) -> None:
        self._cancelled.set()

    async def __aiter__(self) -> AsyncIterator[int]:
        while True:
            item = await self._queue.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item  # type: ignore[misc]
