"""One number before and after: a time (or latency) with its noise range, and the rule that says faster, slower
or no change (pure).

Speed-up = before / after, so > 1 is faster. Its interval is [before low / after high, before high / after
low], each side's (low, high) being its samples' p20-p80. A change is "no change" when that interval holds 1,
or when it is under ``MIN_CHANGE``; "too few samples" when a moved estimate has an unbounded range.
``roofline.verdicts.comparison`` pairs ops and steps with it, ``roofline.verdicts.latency_change`` latency
percentiles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .. import units as U

MIN_CHANGE = 0.03   # run-to-run drift of a GPU (clocks, temperature, placement) is a few percent even when each
#                     run's repetitions agree: a move under 3% is not a change two runs can claim
FASTER, SLOWER, SAME = "faster", "slower", "no change"
NOT_JUDGED = "not judged"   # a comparison with a side timed on a busy host (``Comparison.judged``): no verdict
UNBOUNDED = "too few samples"   # a range with no bound on one side (a p99 of 8 requests): no claim either way


@dataclass(frozen=True)
class Change:
    """A time (or latency) before and after, each with its (low, high) noise range, in seconds."""

    before: float
    after: float
    before_range: tuple
    after_range: tuple

    @property
    def speedup(self) -> float:
        """before / after: 2.0 is twice as fast, 0.5 twice as slow."""
        return self.before / self.after if self.after > 0 else math.nan

    @property
    def interval(self) -> tuple:
        """(low, high) of the speed-up from both sides' ranges: [before low / after high, before high / after low]."""
        (bl, bh), (al, ah) = self.before_range, self.after_range
        return (bl / ah if ah > 0 else math.nan, bh / al if al > 0 else math.inf)

    @property
    def saved(self) -> float:
        """Seconds saved (negative: lost)."""
        return self.before - self.after

    @property
    def bounded(self) -> bool:
        return all(math.isfinite(v) for v in self.before_range + self.after_range)

    @property
    def verdict(self) -> str:
        """"faster" / "slower" beyond the noise, else "no change"; "too few samples" when a moved estimate
        has an unbounded range (``roofline.stats.quantile_interval``)."""
        x = self.speedup
        if math.isnan(x) or abs(x - 1) < MIN_CHANGE:
            return SAME
        if not self.bounded:
            return UNBOUNDED
        lo, hi = self.interval
        if lo <= 1 <= hi:
            return SAME
        return FASTER if x > 1 else SLOWER

    @property
    def ratio_text(self) -> str:
        """'2.00x faster [1.96-2.04x]', '2.00x slower [1.98-2.02x]' or 'no change (1.01x, 0.98-1.03x)'."""
        x = self.speedup
        if math.isnan(x):
            return "n/a"
        lo, hi = self.interval
        rng = f"{lo:.2f}-{hi:.2f}x"
        v = self.verdict
        if v == UNBOUNDED:
            est = f"{x:.2f}x faster" if x > 1 else f"{1 / x:.2f}x slower"
            return f"too few samples (estimate {est}, its range unbounded)"
        if not self.bounded:
            return f"no change ({x:.2f}x)"
        if v == SAME:
            return f"no change ({x:.2f}x, {rng})"
        return f"{x:.2f}x faster [{rng}]" if v == FASTER else f"{1 / x:.2f}x slower [{1 / hi:.2f}-{1 / lo:.2f}x]"

    @property
    def text(self) -> str:
        return f"{U.seconds(self.before)} -> {U.seconds(self.after)}: {self.ratio_text}"


def time_change(before, after) -> Change:
    """The per-step time of two OpResults or two Steps, with their p20-p80 ranges."""
    return Change(before.time_s, after.time_s, before.time_range, after.time_range)
