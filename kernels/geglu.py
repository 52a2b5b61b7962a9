"""GeGLU activation (Gemma's MLP): y = gelu_tanh(gate) * up.

gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))), torch's
``gelu(approximate="tanh")``. gate and up are the outputs of two projections [T, I]
(formulas.geglu: read both, write y). A flat elementwise kernel like ``swiglu``, 1024 elements
a program, math in fp32 after the load; tanh is ``_common.tanh`` (exp2-based: the interpreter
has no libdevice tanh).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from roofline import formulas as F

from ._common import dtype_name, tanh
from .swiglu import launch_gated

@triton.jit
def _geglu_kernel(g_ptr, u_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    inner = 0.7978845608028654 * (g + 0.044715 * g * g * g)                     # sqrt(2 / pi) (g + 0.044715 g^3)
    y = 0.5 * g * (1.0 + tanh(inner)) * u
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def geglu(gate: torch.Tensor, up: torch.Tensor, *, out=None) -> torch.Tensor:
    # gate, up: [..., I]   y: [..., I]
    return launch_gated(_geglu_kernel, gate, up, out)


def reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """torch: gelu(gate, approximate="tanh") * up in fp32 (fp64 for fp64), cast back."""
    ct = torch.float64 if gate.dtype == torch.float64 else torch.float32
    return (torch.nn.functional.gelu(gate.to(ct), approximate="tanh") * up.to(ct)).to(gate.dtype)


def cost(tokens: int, intermediate: int, dtype="bf16"):
    """formulas.geglu (9 FLOPs per element; the tanh is not counted)."""
    d = dtype if isinstance(dtype, str) else dtype_name(dtype)
    return F.geglu(tokens, intermediate, act_dtype=d)
