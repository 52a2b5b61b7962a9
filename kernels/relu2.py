"""ReLU² activation (Nemotron-H's MLP and experts, not gated): y = relu(x)^2.

x is the up projection's output [T, I] (formulas.relu2: read it, write y). A flat elementwise kernel like
``swiglu``, 1024 elements a program, math in fp32 after the load. transformers' ``ReLUSquaredActivation``
(``ACT2FN["relu2"]``) is ``torch.square(relu(x))`` in the input dtype; ``reference`` computes it in fp32 (fp64 for
fp64) and casts back, the same value for fp32 inputs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from roofline import formulas as F

from ._common import FLOAT_DTYPES, cdiv, check_tensor, dtype_name
from ._launch import launch


@triton.jit
def _relu2_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.maximum(tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32), 0.0)
    tl.store(y_ptr + offs, (x * x).to(y_ptr.dtype.element_ty), mask=mask)


def relu2(x: torch.Tensor, *, out=None) -> torch.Tensor:
    """y [..., I] = relu(x)^2; x and out contiguous, of one dtype."""
    check_tensor("x", x, dtypes=FLOAT_DTYPES)
    if not x.is_contiguous():
        raise ValueError("x must be contiguous.")
    out = torch.empty_like(x) if out is None else out
    check_tensor("out", out, tuple(x.shape), dtype=x.dtype)
    if not out.is_contiguous():
        raise ValueError("out must be contiguous.")
    n = x.numel()
    if n:
        launch(_relu2_kernel, (cdiv(n, 1024),), x, out, n, BLOCK=1024, num_warps=4)
    return out


def reference(x: torch.Tensor) -> torch.Tensor:
    ct = torch.float64 if x.dtype == torch.float64 else torch.float32
    return torch.square(torch.relu(x.to(ct))).to(x.dtype)


def cost(tokens: int, intermediate: int, dtype="bf16"):
    """formulas.relu2 (2 FLOPs per element: the max and the square)."""
    d = dtype if isinstance(dtype, str) else dtype_name(dtype)
    return F.relu2(tokens, intermediate, act_dtype=d)
