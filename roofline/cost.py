"""``Cost``: the FLOPs and the minimal DRAM/HBM bytes of a piece of work.

Costs add (two ops run one after the other) and scale (``cost * 32`` for 32 layers).
Intensity is FLOP per byte; a cost with no bytes has infinite intensity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Cost:
    flops: float
    bytes: float

    def __post_init__(self):
        if self.flops < 0 or self.bytes < 0:
            raise ValueError(f"a Cost cannot be negative: {self}")

    @property
    def intensity(self) -> float:
        """Arithmetic intensity in FLOP/byte."""
        if self.bytes == 0:
            return math.inf if self.flops > 0 else 0.0
        return self.flops / self.bytes

    def __add__(self, other: "Cost") -> "Cost":
        if not isinstance(other, Cost):
            return NotImplemented
        return Cost(self.flops + other.flops, self.bytes + other.bytes)

    def __radd__(self, other):
        # lets sum() start from 0
        if other == 0:
            return self
        return NotImplemented

    def __mul__(self, k: float) -> "Cost":
        if not isinstance(k, (int, float)):
            return NotImplemented
        return Cost(self.flops * k, self.bytes * k)

    __rmul__ = __mul__

    def to_dict(self) -> dict:
        return {"flops": self.flops, "bytes": self.bytes}

    @classmethod
    def from_dict(cls, d: dict) -> "Cost":
        return cls(float(d["flops"]), float(d["bytes"]))


ZERO = Cost(0.0, 0.0)
