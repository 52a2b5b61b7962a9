"""SwiGLU activation: y = silu(gate) * up, silu(g) = g / (1 + exp(-g)).

gate and up are the outputs of two separate projections [T, I] (formulas.swiglu: read both,
write y). A flat elementwise kernel, 1024 elements a program, math in fp32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from roofline import formulas as F

from ._common import FLOAT_DTYPES, cdiv, check_tensor, dtype_name
from ._launch import launch


@triton.jit
def _swiglu_kernel(g_ptr, u_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def launch_gated(kernel, gate: torch.Tensor, up: torch.Tensor, out=None) -> torch.Tensor:
    """The gated activations' one launcher (SwiGLU here, GeGLU in kernels.geglu): gate, up, out [..., I], all
    contiguous and of one dtype; one program per 1,024 elements."""
    check_tensor("gate", gate, dtypes=FLOAT_DTYPES)
    check_tensor("up", up, tuple(gate.shape), dtype=gate.dtype, device=gate.device)
    if not (gate.is_contiguous() and up.is_contiguous()):
        raise ValueError("gate and up must be contiguous.")
    out = torch.empty_like(gate) if out is None else out
    check_tensor("out", out, tuple(gate.shape), dtype=gate.dtype)
    if not out.is_contiguous():
        raise ValueError("out must be contiguous.")
    n = gate.numel()
    if n:
        launch(kernel, (cdiv(n, 1024),), gate, up, out, n, BLOCK=1024, num_warps=4)
    return out


def swiglu(gate: torch.Tensor, up: torch.Tensor, *, out=None) -> torch.Tensor:
    # gate, up: [..., I]   y: [..., I]
    return launch_gated(_swiglu_kernel, gate, up, out)


def reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    ct = torch.float64 if gate.dtype == torch.float64 else torch.float32
    return (torch.nn.functional.silu(gate.to(ct)) * up.to(ct)).to(gate.dtype)


def cost(tokens: int, intermediate: int, dtype="bf16"):
    d = dtype if isinstance(dtype, str) else dtype_name(dtype)
    return F.swiglu(tokens, intermediate, act_dtype=d)
