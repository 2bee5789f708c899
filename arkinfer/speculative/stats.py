"""What one speculative generation did: verify steps, drafted and accepted tokens, and where the
time went (draft, verify, prefill)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class SpecStats:
    """Counters one `speculative_generate` call fills in (pass a fresh one per call).

    steps: verify steps (one target `extend` each); drafted / accepted: draft tokens proposed /
    kept; emitted: tokens yielded (the first one comes from the prefill, not from a step);
    prefill_s, draft_s, verify_s: seconds in the target's prefill, in the draft's proposals, and
    in the target's extend + acceptance (+ truncate after a rejection).
    """

    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    prefill_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted (0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens per verify step: accepted draft tokens plus the target's own token (EAGLE's
        tau; 1.0 is plain decoding's rate, the target's token alone)."""
        return (self.accepted + self.steps) / self.steps if self.steps else 0.0

    def as_dict(self) -> dict[str, float | int]:
        return {**asdict(self), "acceptance_rate": self.acceptance_rate,
                "mean_accepted_length": self.mean_accepted_length}
