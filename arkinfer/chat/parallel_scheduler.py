"""Several requests at once on one llama.cpp context: a scheduler thread over parallel sequences.

    sequences = sequences_like(model.runner, n_seq=4, n_ctx_seq=model.context)  # gguf parallel.py
    scheduler = ParallelScheduler(model, sequences, max_waiting=16)
    scheduler.submit(ids, settings, channel)   # QueueFullError when 4 run and 16 wait
    scheduler.close()

The scheduler thread alone touches the context (n_seq slots, a KV stream of n_ctx_seq cells each).
Each iteration it

1. admits waiting requests into free slots, in arrival order, and prefills each prompt on its own
   (chunks of n_batch tokens, logits of the last token only);
2. samples every running request's next token from its logits [V] with that request's settings
   and its own torch.Generator seeded with its seed (`sample_next`, as `generate_tokens` does),
   hands the token to the request's channel, and frees the slot of a request that stops (a stop
   id, max_tokens reached, the client gone);
3. runs ONE decode step, a single llama_decode carrying the sampled token of every request still
   running.

A sequence attends to its own stream only, so a greedy request gets the tokens it gets alone
(tests/chat/test_chat_parallel.py checks 8 concurrent requests against one-by-one runs).
`max_batch` records the most sequences one decode step carried (/health shows it).
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

import torch

from arkinfer.errors import ArkError
from arkinfer.generate import require_finite, sample_next

from .generation import GenerationSettings
from .model import ChatModel
from .runner_queue import QueueFullError
from .token_channel import TokenChannel

#: Requests a gguf artifact runs at once unless `serve --parallel` says otherwise.
DEFAULT_PARALLEL = 4


def check_parallel_with_draft(parallel: int | None, draft: str | None) -> None:
    """Raise ArkError for --parallel > 1 with a draft (its spec or name; "none" is no draft):
    speculative decoding keeps the queued single-sequence path."""
    if draft not in (None, "none") and parallel not in (None, 1):
        raise ArkError(f"--parallel {parallel} with --draft {draft}: speculative decoding runs "
                       "one request at a time on the queued path",
                       hint="drop --parallel (or give --parallel 1) to serve with a draft, or "
                       "drop --draft (--draft none for an artifact that carries one) to run "
                       "requests side by side")


def runs_parallel(model: ChatModel) -> bool:
    """Whether `model`'s runner can run several sequences in one context (the gguf runtime's
    llama.cpp runners, upstream or the InfLLM v2 build, without a draft)."""
    if model.runtime != "gguf" or model.draft is not None:
        return False
    # the runner's own `parallel_sequences(n_seq, n_ctx_seq)` (the in-process llama.cpp runner,
    # and the InfLLM v2 build's, in its child process)
    return callable(getattr(model.runner, "parallel_sequences", None))


def resolve_parallel(model: ChatModel, requested: int | None) -> int:
    """Requests `model` runs at once: `requested`, else DEFAULT_PARALLEL where the runner runs
    parallel sequences and 1 (the queue) elsewhere. ArkError for > 1 on a runner that queues."""
    capable = runs_parallel(model)
    check_parallel_with_draft(requested, None if model.draft is None else model.draft.name)
    if requested is None:
        return DEFAULT_PARALLEL if capable else 1
    if requested < 1:
        raise ArkError(f"--parallel {requested} is below 1",
                       hint="give the number of requests to run at once, e.g. 4 (1: one after "
                       "another)")
    if requested > 1 and not capable:
        raise ArkError(f"--parallel {requested}: the {model.runtime} runtime of {model.name} "
                       "runs one sequence at a time (one KV cache), so `serve` queues its "
                       "requests one after another",
                       hint="drop --parallel (or give 1); requests run side by side on gguf "
                       "artifacts (llama.cpp)")
    return requested


@dataclass
class _Request:
    """A request from submit to its end; slot, gen and logits [V] are set when it is admitted."""

    ids: list[int]
    settings: GenerationSettings
    channel: TokenChannel
    slot: int = -1
    gen: torch.Generator | None = None
    logits: torch.Tensor | None = field(default=None, repr=False)
    produced: int = 0


class ParallelScheduler:
    """Runs up to `sequences.n_seq` requests at once on `sequences` (a `ParallelSequences`: step,
    clear, close, n_seq, n_ctx_seq, n_batch), which it owns and closes; at most `max_waiting`
    more wait for a free slot. `admitted` counts the running and the waiting requests."""

    def __init__(self, model: ChatModel, sequences, max_waiting: int) -> None:
        self.model, self.sequences, self.max_waiting = model, sequences, max_waiting
        self.n_seq = sequences.n_seq
        self.max_batch = 0
        self._where = f"the {model.runtime} runtime of {model.name}"
        self._stop_ids = model.stop_ids
        self._cond = threading.Condition()
        self._waiting: deque[_Request] = deque()
        self._running: dict[int, _Request] = {}  # slot -> request
        self._admitted = 0
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="arkinfer-parallel", daemon=True)
        self._thread.start()

    @property
    def admitted(self) -> int:
        return self._admitted

    def submit(self, ids: list[int], settings: GenerationSettings, channel: TokenChannel) -> None:
        """Queue a request whose tokens go to `channel`; QueueFullError at once when n_seq run
        and max_waiting wait, ArkError for an empty prompt or one that overflows a slot."""
        settings.check()
        if not ids:
            raise ArkError("the prompt is empty after tokenisation", hint="give a non-empty prompt")
        if len(ids) + settings.max_tokens > self.sequences.n_ctx_seq:
            raise ArkError(f"the prompt is {len(ids)} tokens and max_tokens asks for "
                           f"{settings.max_tokens} more: over a slot's {self.sequences.n_ctx_seq} "
                           "cache cells", hint="lower max_tokens or shorten the prompt")
        with self._cond:
            if self._closed:
                raise ArkError("the server is shutting down", hint="retry on a running server")
            if self._admitted >= self.n_seq + self.max_waiting:
                raise QueueFullError(f"{len(self._waiting)} requests are already waiting for a "
                                     f"free slot (the limit is {self.max_waiting}) behind the "
                                     f"{self.n_seq} running", hint="retry in a moment, or start "
                                     "the server with a larger --max-queue or --parallel")
            self._admitted += 1
            self._waiting.append(_Request(list(ids), settings, channel))
            self._cond.notify()

    def close(self) -> None:
        """Stop: waiting and running requests end with an error, then the context is freed."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=60)

    # ---- the scheduler thread
    def _loop(self) -> None:
        try:
            while (admitted := self._admit()) is not None:
                for request in admitted:
                    self._prefill(request)
                self._decode_step()
        finally:
            stopped = ArkError("the server stopped", hint="retry on a running server")
            with self._cond:
                self._closed = True
                left = list(self._waiting) + list(self._running.values())
                self._waiting.clear()
                self._running.clear()
            for request in left:
                request.channel.end(stopped)
            self.sequences.close()

    def _admit(self) -> list[_Request] | None:
        """Waiting requests given a free slot each (blocks while nothing runs or waits); None
        once closed."""
        with self._cond:
            while not self._closed and not self._waiting and not self._running:
                self._cond.wait()
            if self._closed:
                return None
            free = [slot for slot in range(self.n_seq) if slot not in self._running]
            admitted = []
            while self._waiting and free:
                request = self._waiting.popleft()
                request.slot = free.pop(0)
                self._running[request.slot] = request
                admitted.append(request)
            return admitted

    def _prefill(self, request: _Request) -> None:
        """The prompt into the request's slot: its logits [V] for the first token."""
        if request.channel.cancelled():  # the client left while the request waited
            self._end(request)
            return
        seqs, slot, ids = self.sequences, request.slot, request.ids
        try:
            seqs.clear(slot)  # the stream of the request that had the slot before
            for start in range(0, len(ids), seqs.n_batch):
                out = seqs.step({slot: ids[start:start + seqs.n_batch]}, last_only=True)
            request.logits = out[slot][-1]
        except Exception as exc:  # noqa: BLE001 - handed to the request that waits
            self._end(request, exc)
            return
        request.gen = torch.Generator().manual_seed(request.settings.seed)

    def _decode_step(self) -> None:
        """Sample each running request's next token, hand it over, then one decode step for
        every request that goes on."""
        tokens: dict[int, list[int]] = {}
        for request in list(self._running.values()):
            settings = request.settings
            try:
                require_finite(request.logits, self._where)
                token = sample_next(request.logits, settings.temperature, settings.top_p,
                                    request.gen)
            except Exception as exc:  # noqa: BLE001 - handed to the request that waits
                self._end(request, exc)
                continue
            request.channel.put(token)
            request.produced += 1
            if (token in self._stop_ids or request.produced == settings.max_tokens
                    or request.channel.cancelled()):
                self._end(request)
            else:
                tokens[request.slot] = [token]
        if not tokens:
            return
        self.max_batch = max(self.max_batch, len(tokens))
        try:
            out = self.sequences.step(tokens)
        except Exception as exc:  # noqa: BLE001 - every request in the step failed with it
            for slot in tokens:
                self._end(self._running[slot], exc)
            return
        for slot, logits in out.items():
            self._running[slot].logits = logits[-1]

    def _end(self, request: _Request, error: BaseException | None = None) -> None:
        """Free the request's slot and end its channel (with `error` when it failed)."""
        with self._cond:
            self._running.pop(request.slot, None)
            self._admitted -= 1
        request.channel.end(error)
