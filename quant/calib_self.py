"""`--calib self`: calibration text the model writes itself (data-free self-calibration).

    domains, record = self_domains(ckpt, samples=128, seq_len=512, seed=0, progress=print)

Some models come without their training data, and a quantiser fitted to text the model rarely
sees fits the wrong activations. Sampling from the model itself gives text from its own
distribution (the data-free / self-calibration idea, e.g. LLM-QAT's generated data): from each of
`SEEDS` — chats in English and Chinese, a code request, maths questions, legal and technical
explanations, all rendered through the model's chat template with the generation prompt, and
the bare BOS token — the reference model (`arkinfer.frontend.checkpoint.load_model`, float32)
samples at temperature 1.0, top-p 1, no top-k: the model's own softmax, nothing cut off
(`arkinfer.generate.sample_next` per row). A sample is its prompt plus what the model wrote, up
to `seq_len` tokens (at least `seq_len / 2` written ones after a long prompt,
`new_tokens_for`), and ends at the first stop token (EOS, `<|im_end|>`), which it keeps.

Batched (`sample_group`): the samples are made in groups of `BATCH` that share a prompt, so no
padding is needed: the prompt is prefilled once (batch 1), its KV cache repeated to the group's
rows, then every decode step runs all unfinished rows as one batch [rows, 1] (decode reads every
weight once per step, whatever the batch, so tokens/s grows nearly with the rows). Each row has
its own generator and draws from its own logits as `arkinfer.generate.generate` would (batched
logits may differ from batch-1 ones in the last float bits, so a row can, rarely, take another
token than a one-at-a-time run); a row that draws a stop token (or reaches the length) is
finished and dropped from the batch.

One `Domain` per seed kind (`self-chat`, `self-chat-zh`, `self-code`, `self-math`,
`self-explain`, `self-bos`) carries the token ids as generated (`Domain.ids`), so
`load_calibration` deals windows to them like the built-in corpus. Domain d gets windows
d, d + D, ... of `samples` (D = the domains used); it is sampled until its samples hold
`windows x seq_len + 1` tokens.

Determinism: sample k of domain d is row k mod BATCH of group g = k // BATCH, which uses seed
prompt g mod (its prompts) and the generator seed `sample_seed(seed, d, k)`. Groups are made
whole (a group's extra samples are cached for a later, larger run), so a sample depends on
(seed, d, k) only — not on how many were asked for or what the cache held — and the samples of a
larger `--samples` begin with those of a smaller one. They are cached in
`$ARKINFER_CACHE/calib-self/<model>-<seed>-<settings>.jsonl` (`cache_path`): `<model>` is
`model_key` (below), `<settings>` hashes the seed prompts as token ids (so the tokenizer and
chat template), temperature, top-p, seq_len, `BATCH` and this file's `FORMAT_VERSION` (2:
batched groups; version 1 files are not reused). A later run reuses the file, and generates only
the samples it lacks; a file that does not parse is generated again with a note. Files are
replaced atomically (temp + rename) under a lock.

Cache file, JSON Lines: line 1 `{"format": "arkinfer-calib-self", "version", "model_sha256",
"seed", "settings_sha256", "settings"}`; then one record per sample `{"domain", "index",
"prompt_tokens", "ids": [int, ...], "text"}` (text: the ids decoded, for reading only).
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .calib_corpus import Domain
from .weight import QuantError

FORMAT = "arkinfer-calib-self"
FORMAT_VERSION = 2  # 2: samples made in groups of BATCH sharing a prompt (1: one at a time)
BATCH = 16  # rows decoded together; in the settings hash (a group's rows share its prompt)
TEMPERATURE = 1.0  # the model's own distribution: no sharpening, no nucleus, no top-k
TOP_P = 1.0
HASH_EDGE = 1 << 20  # model_key reads the first and last MiB of each shard
PROGRESS_EVERY_S = 2.0

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Seed:
    """A seed prompt: `domain` it feeds, the user message (None: the bare BOS token)."""

    domain: str
    prompt: str | None


# Order: the order the domains are dealt windows in (a run with fewer windows than domains uses
# the first ones). Several prompts per kind so a domain is not one conversation repeated.
SEEDS: tuple[Seed, ...] = (
    Seed("self-chat", "What should I pack for a three-day hiking trip in the mountains?"),
    Seed("self-chat", "My friend forgot my birthday. How should I bring it up without a fight?"),
    Seed("self-chat-zh", "请介绍一下中国的春节有哪些传统习俗。"),
    Seed("self-chat-zh", "我想学好一门外语，每天应该怎样安排时间？"),
    Seed("self-code", "Write a Python function that merges two sorted lists into one sorted "
         "list, with a docstring and a few tests."),
    Seed("self-code", "Explain what this shell command does and when it is dangerous: "
         "find . -name '*.log' -mtime +7 -delete"),
    Seed("self-math", "A train covers 180 km in 2.5 hours. What is its average speed in metres "
         "per second? Solve it step by step."),
    Seed("self-math", "Prove that the sum of the first n odd numbers is n squared."),
    Seed("self-explain", "Explain in plain language what an indemnification clause in a "
         "contract means and why it matters."),
    Seed("self-explain", "How does TCP congestion control work? Explain slow start and "
         "congestion avoidance."),
    Seed("self-explain", "What is the difference between a patent and a copyright?"),
    Seed("self-bos", None),
)
DOMAINS: tuple[str, ...] = tuple(dict.fromkeys(s.domain for s in SEEDS))


def model_key(folder: Path, weight_files: list[Path]) -> str:
    """SHA-256 naming a checkpoint's weights, cheap enough for every run: config.json, the
    safetensors index (when sharded), and per shard its name, size and first and last MiB.

    Not a hash of every byte (an 8B checkpoint is 16 GB, about a minute to hash): the first MiB
    holds each shard's safetensors header (every tensor's name, dtype, shape and offset) and
    its first weights, the last MiB its last weights; a checkpoint edited in the middle of a
    shard with its size kept keeps its key (delete `calib-self/` in the cache after such an
    edit)."""
    h = hashlib.sha256()
    for name in ("config.json", "model.safetensors.index.json"):
        path = folder / name
        if path.is_file():
            h.update(f"{name}\0".encode() + path.read_bytes() + b"\0")
    for path in sorted(weight_files, key=lambda p: p.name):
        size = path.stat().st_size
        h.update(f"{path.name}\0{size}\0".encode())
        with open(path, "rb") as fh:
            h.update(fh.read(HASH_EDGE))
            if size > HASH_EDGE:
                fh.seek(max(HASH_EDGE, size - HASH_EDGE))
                h.update(fh.read(HASH_EDGE))
    return h.hexdigest()


def sample_seed(seed: int, domain: str, index: int) -> int:
    """The generator seed of sample `index` of `domain` (64-bit, from `seed`)."""
    digest = hashlib.sha256(f"{seed}/{domain}/{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def windows_per_domain(samples: int, n_domains: int = len(DOMAINS)) -> dict[str, int]:
    """{domain: windows} as `load_calibration` deals `samples` windows (domain i: i, i + D, ...)."""
    used = DOMAINS[:min(samples, n_domains)]
    return {d: len(range(i, samples, len(used))) for i, d in enumerate(used)}


def seed_prompts(tokenizer: Any, bos_id: int | None) -> dict[str, list[list[int]]]:
    """{domain: [prompt ids, ...]}: chats rendered through the chat template with the generation
    prompt (no template: "user: ...\\nassistant:" after BOS), the BOS seed as [bos_id]. A model
    with neither BOS nor EOS has no self-bos domain."""
    out: dict[str, list[list[int]]] = {}
    for s in SEEDS:
        if s.prompt is None:
            if bos_id is None:
                continue
            ids = [bos_id]
        elif getattr(tokenizer, "chat_template", None):
            ids = tokenizer.encode_chat([{"role": "user", "content": s.prompt}],
                                        add_generation_prompt=True)
        else:
            ids = tokenizer.encode(f"user: {s.prompt}\nassistant:", add_special_tokens=True)
        out.setdefault(s.domain, []).append(list(ids))
    return out


def first_token_id(*values: Any) -> int | None:
    """The first int among `values` (a config's bos/eos may be an int, a list or None)."""
    for value in values:
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, int) and not isinstance(v, bool):
                return v
    return None


def self_domains(ckpt: Any, samples: int, seq_len: int, seed: int = 0,
                 progress: Progress | None = None, cache_dir: str | Path | None = None
                 ) -> tuple[list[Domain], dict[str, Any]]:
    """The `--calib self` domains for `samples` windows of `seq_len` tokens, and the record that
    goes into the calibration settings (model hash, seeds, temperature, cache file)."""
    from arkinfer.frontend.cache import cache_dir_path, locked
    from arkinfer.frontend.safetensors_io import weight_files

    tok = ckpt.tokenizer
    if tok is None:
        raise QuantError(f"{ckpt.path} has no tokenizer.json; --calib self decodes and renders "
                         "chat prompts with it", "add the model's tokenizer.json to the folder")
    cfg = ckpt.config
    bos_id = first_token_id(getattr(cfg, "bos_token_id", None),
                            tok.token_id(tok.bos_token) if tok.bos_token else None,
                            getattr(cfg, "eos_token_id", None))
    prompts = seed_prompts(tok, bos_id)
    settings = {"format_version": FORMAT_VERSION, "temperature": TEMPERATURE, "top_p": TOP_P,
                "top_k": None, "seq_len": seq_len, "dtype": "float32", "batch": BATCH,
                "stop_ids": sorted(tok.stop_ids), "prompts": prompts}
    settings_sha = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()
    model_sha = model_key(ckpt.path, weight_files(ckpt.path))
    root = cache_dir_path(cache_dir) / "calib-self"
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"{model_sha[:16]}-{seed}-{settings_sha[:16]}.jsonl"
    header = {"format": FORMAT, "version": FORMAT_VERSION, "model_sha256": model_sha,
              "seed": seed, "settings_sha256": settings_sha, "settings": settings}
    wanted = {d: n * seq_len + 1 for d, n in windows_per_domain(samples, len(prompts)).items()
              if d in prompts}
    say = progress or (lambda _msg: None)
    with locked(root, path.stem):
        records = read_cache(path, header, tok.vocab_size, say)
        chosen, missing = _take(records, wanted)
        if missing:
            what = "extending" if records else "writing"
            say(f"self-calibration: sampling the model, {what} {path}")
            records += _generate(ckpt, prompts, missing, seq_len, seed, say)
            _write_atomic(path, header, records)
            chosen, missing = _take(records, wanted)
        else:
            say(f"self-calibration: reusing {path}")
    domains = [Domain(d, path, b"".join(_line(r) for r in chosen[d]),
                      tuple(tuple(r["ids"]) for r in chosen[d])) for d in wanted]
    record = {"method": "sampled from the model itself", "model_sha256": model_sha,
              "model_hash": "sha256 of config.json, the index, and each shard's name, size and "
              "first and last MiB", "seed": seed, "temperature": TEMPERATURE, "top_p": TOP_P,
              "top_k": None, "dtype": "float32", "settings_sha256": settings_sha,
              "cache_file": path.name,
              "seeds": [{"domain": s.domain, "prompt": s.prompt if s.prompt is not None
                         else "<bos>"} for s in SEEDS if s.domain in wanted]}
    return domains, record


def _take(records: list[dict], wanted: dict[str, int]
          ) -> tuple[dict[str, list[dict]], dict[str, tuple[int, int]]]:
    """The first records of each domain that hold its wanted tokens, and what is missing:
    {domain: (next index, tokens still needed)}."""
    chosen: dict[str, list[dict]] = {d: [] for d in wanted}
    missing: dict[str, tuple[int, int]] = {}
    for d, need in wanted.items():
        have = 0
        mine = [r for r in records if r["domain"] == d]
        for r in mine:
            if have >= need:
                break
            chosen[d].append(r)
            have += len(r["ids"])
        if have < need:
            missing[d] = (len(mine), need - have)
    return chosen, missing


def read_cache(path: Path, header: dict, vocab_size: int, say: Progress) -> list[dict]:
    """The records of a cache file made with `header`'s settings; [] when it does not exist, and
    [] with a note when it is damaged (then it is generated again)."""
    if not path.exists():
        return []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
        first = json.loads(lines[0]) if lines else None
        if first != header:
            raise ValueError("its header does not match this model and settings")
        records, next_index = [], {d: 0 for d in DOMAINS}
        for n, line in enumerate(lines[1:], 2):
            r = json.loads(line)
            ids = r.get("ids") if isinstance(r, dict) else None
            if not (isinstance(ids, list) and ids and r.get("domain") in next_index
                    and r.get("index") == next_index[r["domain"]]
                    and all(type(i) is int and 0 <= i < vocab_size for i in ids)):
                raise ValueError(f"line {n} is not a sample record in order")
            next_index[r["domain"]] += 1
            records.append(r)
        return records
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        say(f"note: the self-calibration cache {path} is damaged ({str(exc)[:120]}); "
            "generating it again")
        return []


def _generate(ckpt: Any, prompts: dict[str, list[list[int]]],
              missing: dict[str, tuple[int, int]], seq_len: int, seed: int,
              say: Progress) -> list[dict]:
    """Sample the missing records, domain by domain, in whole groups of BATCH (`sample_group`),
    reporting samples, tokens and tokens/s every PROGRESS_EVERY_S, also within a group."""
    from arkinfer.frontend.checkpoint import load_model

    positions = getattr(ckpt.config, "max_position_embeddings", None)
    model = load_model(ckpt)
    if hasattr(model, "set_dense"):  # what `checkpoint.load` does: sparse models run their path
        model.set_dense(False)
        model.set_sparse_impl("fast")
    out: list[dict] = []
    total = sum(need for _, need in missing.values())
    count = {"done": 0, "new": 0}  # tokens of the finished samples, tokens written so far
    t0, shown = time.perf_counter(), [0.0]

    def report(new: int) -> None:
        count["new"] += new
        now = time.perf_counter()
        if now - shown[0] >= PROGRESS_EVERY_S:
            shown[0] = now
            say(f"self-calibration: {len(out)} samples, {min(count['done'], total):,} of "
                f"{total:,} tokens, {count['new'] / max(now - t0, 1e-9):,.0f} tokens/s")

    try:
        for d, (index, need) in missing.items():
            have = 0
            while have < need:
                first = index - index % BATCH  # the group is made whole, rows before index dropped
                prompt = prompts[d][first // BATCH % len(prompts[d])]
                seeds = [sample_seed(seed, d, k) for k in range(first, first + BATCH)]
                rows = sample_group(model, prompt, new_tokens_for(len(prompt), seq_len, positions),
                                    seeds, ckpt.tokenizer.stop_ids, report)
                for k, ids in enumerate(rows[index - first:], index):
                    out.append({"domain": d, "index": k, "prompt_tokens": len(prompt),
                                "ids": ids, "text": ckpt.tokenizer.decode(ids)})
                    have += len(ids)
                    count["done"] += len(ids)
                index = first + BATCH
    finally:
        del model
        gc.collect()
    elapsed = time.perf_counter() - t0
    say(f"self-calibration: {len(out)} samples, {count['done']:,} tokens in {elapsed:.1f} s "
        f"({count['new'] / max(elapsed, 1e-9):,.0f} tokens/s, batches of {BATCH})")
    return out


def new_tokens_for(prompt_len: int, seq_len: int, max_positions: int | None = None) -> int:
    """How many tokens a sample may add to a prompt of `prompt_len`: up to `seq_len` in all, but
    at least seq_len / 2 (a short --seq-len must not give samples that are all prompt), within
    the model's positions."""
    new = max(seq_len - prompt_len, seq_len // 2, 1)
    if max_positions is not None:
        new = min(new, max(max_positions - prompt_len, 1))
    return new


@torch.no_grad()
def sample_group(model: Any, prompt: list[int], max_new_tokens: int, seeds: list[int],
                 stop_ids: set[int] | frozenset[int],
                 on_step: Callable[[int], None] | None = None) -> list[list[int]]:
    """One sample per seed, all continuing `prompt`: row r is `prompt` plus up to
    `max_new_tokens` tokens, each drawn by `sample_next` at TEMPERATURE / TOP_P from the row's
    own logits with the generator seeded `seeds[r]` — what `generate(model, prompt, ...,
    seed=seeds[r])` defines — and ends at its first stop token, which it keeps.

    The prompt is prefilled once (batch 1) and its cache repeated to the rows (a plain (k, v)
    tuple per layer, [rows, Hkv, S, D]); each decode step feeds the unfinished rows' last tokens
    [rows, 1] at one shared position (all rows have the same length) and drops the rows that
    finished from the batch and the cache. `on_step(n)` gets the tokens each step wrote."""
    from arkinfer.generate import forward_checked, sample_next

    if not prompt:
        raise QuantError("a --calib self seed prompt is empty", "check the tokenizer")
    where = "--calib self"
    gens = [torch.Generator().manual_seed(s) for s in seeds]
    logits, cache = forward_checked(model, torch.tensor([prompt]), torch.arange(len(prompt)),
                                    model.empty_cache(1), where)
    rows = [list(prompt) for _ in seeds]
    live = list(range(len(seeds)))  # row r of the batch is sample live[r]
    last = logits[:, -1].expand(len(live), -1)
    cache = [tuple(t.expand(len(live), *t.shape[1:]) for t in layer) for layer in cache]
    for step in range(max_new_tokens):
        keep = []
        for r, sample in enumerate(live):
            token = sample_next(last[r], TEMPERATURE, TOP_P, gens[sample])
            rows[sample].append(token)
            if token not in stop_ids and step + 1 < max_new_tokens:
                keep.append(r)
        if on_step is not None:
            on_step(len(live))
        if not keep:
            break
        if len(keep) < len(live):
            pick = torch.tensor(keep)
            cache = [tuple(t.index_select(0, pick) for t in layer) for layer in cache]
            live = [live[r] for r in keep]
        ids = torch.tensor([[rows[s][-1]] for s in live])
        logits, cache = forward_checked(model, ids, torch.tensor([len(prompt) + step]), cache,
                                        where)
        last = logits[:, -1]
    return rows


def _line(record: dict) -> bytes:
    return (json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


def _write_atomic(path: Path, header: dict, records: list[dict]) -> None:
    """`path` replaced in one step: written to a temporary file beside it, then renamed."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(_line(header))
            for r in records:
                fh.write(_line(r))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
