"""FR-Spec: restrict an EAGLE-3 head's output to the most frequent tokens.

The head's lm_head [Vd, H] is most of its cost when the vocabulary is large; most drafted tokens
come from a small, frequent part of it. A restricted head proposes only those tokens (the target
verifies on the full vocabulary, so the output never changes; only the acceptance can drop).

The vocabulary maps (eagle3_head.py): d2t int64 [Vd], target id of draft id d = d + d2t[d];
t2d bool [V], whether a target id is in the draft vocabulary.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

import torch
from torch import Tensor

from arkinfer.errors import ArkError
from arkinfer.speculative.eagle3_head import Eagle3Head, build_head


def token_frequencies(token_streams: Iterable[list[int]], vocab_size: int) -> Tensor:
    """int64 [vocab_size]: how often each id occurs in the streams (ids outside 0..V-1 refused)."""
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for stream in token_streams:
        ids = torch.as_tensor(stream, dtype=torch.int64)
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
            bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
            raise ArkError(f"token id {bad} is outside the vocabulary 0..{vocab_size - 1}",
                           hint="count tokens made by the target's own tokenizer")
        counts += torch.bincount(ids, minlength=vocab_size)
    return counts


def frequent_vocabulary(freq: Tensor, k: int, always: Iterable[int] = ()) -> Tensor:
    """int64 [k], ascending: the ids in `always` (e.g. stop ids) plus the most frequent others
    (ties broken by the lower id) up to k in all."""
    vocab = freq.shape[0]
    forced = sorted({int(i) for i in always})
    if not 1 <= k <= vocab:
        raise ArkError(f"draft vocabulary k={k} is out of range for a vocabulary of V={vocab}",
                       hint=f"--draft-vocab K must be 1..V (1..{vocab})")
    if any(not 0 <= i < vocab for i in forced) or len(forced) > k:
        raise ArkError(f"always-kept ids {forced} do not fit a draft vocabulary of k={k} over "
                       f"V={vocab}", hint="give fewer ids, each in 0..V-1, or a larger k")
    # sort by count descending, then id ascending: a stable sort on -count keeps id order in ties
    order = torch.sort(-freq.to(torch.int64), stable=True).indices
    keep = torch.zeros(vocab, dtype=torch.bool)
    keep[forced] = True
    others = order[~keep[order]]
    keep[others[:k - len(forced)]] = True
    return torch.nonzero(keep).flatten()


def restrict_head(head: Eagle3Head, keep: Tensor) -> Eagle3Head:
    """A copy of `head` whose draft vocabulary is the target ids in `keep` that `head` can
    propose (rows of its lm_head copied, d2t / t2d / draft_vocab_size rebuilt). The other
    weights are shared with `head`, which is left unchanged."""
    cfg = head.config
    keep = torch.unique(torch.as_tensor(keep, dtype=torch.int64))
    if keep.numel() and (int(keep[0]) < 0 or int(keep[-1]) >= cfg.vocab_size):
        raise ArkError(f"ids to keep must be 0..{cfg.vocab_size - 1}", hint="pass target ids")
    targets = head.to_target(torch.arange(cfg.draft_vocab_size))  # [Vd] target id of each row
    rows = torch.nonzero(torch.isin(targets, keep)).flatten()
    if rows.numel() == 0:
        raise ArkError(f"none of the {keep.numel()} ids to keep is in the head's draft vocabulary",
                       hint="keep ids the head can propose (its t2d)")
    kept_targets = targets[rows]
    t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    t2d[kept_targets] = True
    state = dict(head.state_dict())  # the same tensors: the new head shares them
    state["lm_head.weight"] = head.lm_head.weight.detach()[rows].clone()
    state["d2t"] = kept_targets - torch.arange(rows.numel())
    state["t2d"] = t2d
    return build_head(replace(cfg, draft_vocab_size=int(rows.numel())), state)
