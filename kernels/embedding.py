"""Token embedding: gather rows of the [vocab, H] table for token ids [T]."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from roofline import formulas as F

from ._common import FLOAT_DTYPES, check_tensor, dtype_name, next_pow2
from ._launch import launch


@triton.jit
def _embedding_kernel(ids_ptr, table_ptr, out_ptr, H, stride_t, stride_o, BLOCK_H: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    tok = tl.load(ids_ptr + t).to(tl.int64)
    offs = tl.arange(0, BLOCK_H)
    mask = offs < H
    row = tl.load(table_ptr + tok * stride_t + offs, mask=mask, other=0.0)
    tl.store(out_ptr + t * stride_o + offs, row.to(out_ptr.dtype.element_ty), mask=mask)


def embedding(ids: torch.Tensor, table: torch.Tensor, *, out=None) -> torch.Tensor:
    """ids [T] int -> [T, H]. Ids are not range-checked here (that would sync); the model checks them."""
    # ids: [T]   table: [V, H]   out: [T, H]
    check_tensor("table", table, (None, None), dtypes=FLOAT_DTYPES)
    check_tensor("ids", ids, (None,), dtypes=(torch.int32, torch.int64), device=table.device)
    T, H = ids.shape[0], table.shape[1]
    out = torch.empty(T, H, dtype=table.dtype, device=table.device) if out is None else out
    check_tensor("out", out, (T, H), dtype=table.dtype)
    if T:
        launch(_embedding_kernel, (T,), ids, table, out, H, table.stride(0), out.stride(0), BLOCK_H=next_pow2(H))
    return out


def reference(ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    return table[ids]


def cost(tokens: int, hidden: int, dtype="bf16"):
    d = dtype if isinstance(dtype, str) else dtype_name(dtype)
    return F.embedding(tokens, hidden, weight_dtype=d, act_dtype=d)
