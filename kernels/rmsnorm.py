"""RMSNorm, and residual-add fused with RMSNorm.

``rmsnorm(x, w)``: y = x / sqrt(mean(x^2) + eps) * w, one program per row.
``add_rmsnorm(x, r, w)``: h = x + r (the new residual stream, stored), y = rmsnorm(h);
one pass reads x and r and writes h and y (formulas.add_rmsnorm's 4 activation passes).
The norm is taken of h as stored (rounded to the activation dtype), so the fused pair gives
exactly what residual add then rmsnorm give.

Math in fp32 after each load; one cast at each store. The reference does the same in torch
(HF's LlamaRMSNorm also computes the statistic in fp32).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from roofline import formulas as F

from ._common import FLOAT_DTYPES, check_tensor, dtype_name, next_pow2
from ._launch import launch


@triton.jit
def _rmsnorm_kernel(x_ptr, r_ptr, h_ptr, w_ptr, y_ptr, H, stride_x, stride_r, stride_h, stride_y, eps,
                    BLOCK_H: tl.constexpr, ADD: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_H)
    mask = offs < H
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    if ADD:
        r = tl.load(r_ptr + row * stride_r + offs, mask=mask, other=0.0).to(tl.float32)
        h = (x + r).to(h_ptr.dtype.element_ty)
        tl.store(h_ptr + row * stride_h + offs, h, mask=mask)
        x = h.to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / H + eps)
    tl.store(y_ptr + row * stride_y + offs, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


def _check(x, w, name="x"):
    check_tensor("weight", w, (None,), dtypes=FLOAT_DTYPES)
    H = w.shape[0]
    check_tensor(name, x, dtypes=FLOAT_DTYPES, device=w.device)
    if x.dim() == 0 or x.shape[-1] != H:
        raise ValueError(f"{name} must have shape [..., {H}] to match the weight [{H}], got {list(x.shape)}.")
    return H


def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-5, *, out=None) -> torch.Tensor:
    # x: [..., H]   w: [H]   y: [..., H] (x's dtype)
    H = _check(x, w)
    x2 = x.reshape(-1, H)
    out = torch.empty_like(x) if out is None else out
    check_tensor("out", out, tuple(x.shape), dtype=x.dtype)
    y2 = out.view(-1, H)
    if x2.shape[0]:
        launch(_rmsnorm_kernel, (x2.shape[0],), x2, x2, x2, w, y2, H, x2.stride(0), 0, 0, y2.stride(0), eps,
                                        BLOCK_H=next_pow2(H), ADD=False, num_warps=_warps(H))
    return out


def add_rmsnorm(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, eps: float = 1e-5, *, out=None):
    """Returns (h, y): h = x + r, y = rmsnorm(h) * w (written into ``out=(h, y)`` if given)."""
    # x, r: [..., H]   w: [H]   h, y: [..., H]
    H = _check(x, w)
    check_tensor("residual", r, tuple(x.shape), dtype=x.dtype)
    x2, r2 = x.reshape(-1, H), r.reshape(-1, H)
    h, y = (torch.empty_like(x), torch.empty_like(x)) if out is None else out
    check_tensor("out[0] (h)", h, tuple(x.shape), dtype=x.dtype)
    check_tensor("out[1] (y)", y, tuple(x.shape), dtype=x.dtype)
    h2, y2 = h.view(-1, H), y.view(-1, H)
    if x2.shape[0]:
        launch(_rmsnorm_kernel, (x2.shape[0],), x2, r2, h2, w, y2, H, x2.stride(0), r2.stride(0), h2.stride(0),
                                        y2.stride(0), eps, BLOCK_H=next_pow2(H), ADD=True, num_warps=_warps(H))
    return h, y


def _warps(H: int) -> int:
    return 4 if H <= 2048 else 8 if H <= 8192 else 16


def reference(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    xf = x.float() if x.dtype != torch.float64 else x
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.to(xf.dtype)
    return y.to(x.dtype)


def add_reference(x, r, w, eps: float = 1e-5):
    h = (x.float() + r.float()).to(x.dtype) if x.dtype != torch.float64 else x + r
    return h, reference(h, w, eps)


def cost(tokens: int, hidden: int, dtype="bf16"):
    d = dtype if isinstance(dtype, str) else dtype_name(dtype)
    return F.rmsnorm(tokens, hidden, act_dtype=d, weight_dtype=d)


def add_cost(tokens: int, hidden: int, dtype="bf16"):
    d = dtype if isinstance(dtype, str) else dtype_name(dtype)
    return F.add_rmsnorm(tokens, hidden, act_dtype=d, weight_dtype=d)
