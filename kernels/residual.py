"""Residual add: h = x + r (the unfused form; rmsnorm.add_rmsnorm is the fused one)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from roofline import formulas as F

from ._common import FLOAT_DTYPES, cdiv, check_tensor, dtype_name
from ._launch import launch


@triton.jit
def _add_kernel(x_ptr, r_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, (x + r).to(y_ptr.dtype.element_ty), mask=mask)


def residual_add(x: torch.Tensor, r: torch.Tensor, *, out=None) -> torch.Tensor:
    # x, r: [..., H]   h: [..., H]
    check_tensor("x", x, dtypes=FLOAT_DTYPES)
    check_tensor("residual", r, tuple(x.shape), dtype=x.dtype, device=x.device)
    if not (x.is_contiguous() and r.is_contiguous()):
        raise ValueError("x and residual must be contiguous.")
    out = torch.empty_like(x) if out is None else out
    check_tensor("out", out, tuple(x.shape), dtype=x.dtype)
    n = x.numel()
    if n:
        launch(_add_kernel, (cdiv(n, 1024),), x, r, out, n, BLOCK=1024, num_warps=4)
    return out


def reference(x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    return x + r


def cost(tokens: int, hidden: int, dtype="bf16"):
    d = dtype if isinstance(dtype, str) else dtype_name(dtype)
    return F.residual_add(tokens, hidden, act_dtype=d)
