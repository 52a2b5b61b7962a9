"""One row of ``roofline check`` (``CheckResult``: name, error, tolerance, verdict) and the relative error most rows
use; shared by ``kernels.check`` and the check modules it gathers (``kernels.check_fp8``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class CheckResult:
    name: str
    max_rel_err: float
    tol: float
    passed: bool
    detail: str = ""

    def __str__(self):
        mark = "ok  " if self.passed else "FAIL"
        return f"{mark} {self.name:<34} max rel err {self.max_rel_err:9.2e}  tol {self.tol:7.1e}  {self.detail}"


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref| / max |ref| in fp64; inf for a wrong shape or a non-finite output."""
    out, ref = out.double(), ref.double()
    if out.shape != ref.shape or not torch.isfinite(out).all():
        return math.inf
    return float((out - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def result(name, err, tol, detail="") -> CheckResult:
    """The row: passed when ``err <= tol``."""
    return CheckResult(name, err, tol, bool(err <= tol), detail)
