"""The short depthwise causal conv1d with its state (Mamba-2's over x, B, C; Gated DeltaNet's over q, k, v): kernel
size K, an optional bias, an optional SiLU, one kernel for prefill (T new tokens) and the decode update (T = 1).

Shapes: x [B, T, C] (last dimension contiguous; any batch / token strides, so a split of in_proj's output passes
as a view), weight [C, K] (the checkpoint's [C, 1, K] squeezed), bias [C] or None. A sequence's conv state is
``conv_state[slots[b]]`` [S, C, K - 1]: its last K - 1 inputs (vLLM's layout; transformers' cache keeps K columns,
the first never read), read by every call (a fresh sequence's is zeros, the caller's) and rewritten with the last
K - 1 inputs of [state, x].

``_conv1d_kernel``, grid (B, cdiv(T, BLOCK_T), cdiv(C, BLOCK_C)): each output is the K taps over [state, x] (the
first K - 1 positions reach into the state), + bias, then SiLU; every load upcast to fp32, fp32 maths, one cast
at the store. The programs of the first token block write the new state after their reads (a barrier between:
only they read the state, as BLOCK_T >= K - 1).

``reference`` is transformers 5.24's ``causal_conv1d_update`` (modeling_nemotron_h.py; its ``causal_conv1d_fn``
is the same over a zero state) on the slots' gathered states; ``cost`` is ``roofline.formulas.causal_conv1d``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as Fn
import triton
import triton.language as tl

from roofline import formulas as F

from ._common import FLOAT_DTYPES, cdiv, check_tensor, dtype_name, next_pow2
from ._launch import launch

MAX_KERNEL = 9     # BLOCK_T >= 8 >= K - 1: only the first token block reads the state


@triton.jit
def _conv1d_kernel(x_ptr, w_ptr, b_ptr, cs_ptr, slot_ptr, y_ptr, T, C, sx_b, sx_t, sy_b, sy_t, sc_s, sc_c,
                   KSIZE: tl.constexpr, BIAS: tl.constexpr, SILU: tl.constexpr,
                   BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_S: tl.constexpr):
    b = tl.program_id(0)
    tb = tl.program_id(1)
    offs_t = tb * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = offs_c < C
    slot = tl.load(slot_ptr + b).to(tl.int64)
    x_base = x_ptr + b.to(tl.int64) * sx_b
    cs_base = cs_ptr + slot * sc_s + offs_c[None, :] * sc_c
    acc = tl.zeros((BLOCK_T, BLOCK_C), tl.float32)
    if BIAS:
        acc += tl.load(b_ptr + offs_c, mask=cmask, other=0.0).to(tl.float32)[None, :]
    for j in tl.static_range(KSIZE):
        src = offs_t - (KSIZE - 1) + j                                    # the input position this tap reads
        inx = (src >= 0) & (offs_t < T)
        val = tl.load(x_base + src[:, None] * sx_t + offs_c[None, :], mask=inx[:, None] & cmask[None, :],
                      other=0.0).to(tl.float32)
        ins = (src < 0) & (offs_t < T)
        val += tl.load(cs_base + (KSIZE - 1 + src)[:, None], mask=ins[:, None] & cmask[None, :],
                       other=0.0).to(tl.float32)
        wj = tl.load(w_ptr + offs_c * KSIZE + j, mask=cmask, other=0.0).to(tl.float32)
        acc += val * wj[None, :]
    if SILU:
        acc = acc / (1.0 + tl.exp(-acc))
    tl.store(y_ptr + b.to(tl.int64) * sy_b + offs_t[:, None] * sy_t + offs_c[None, :],
             acc.to(y_ptr.dtype.element_ty), mask=(offs_t < T)[:, None] & cmask[None, :])
    if tb == 0:                                   # the new state: the last KSIZE - 1 inputs of [state, x]
        js = tl.arange(0, BLOCK_S)
        jmask = js < KSIZE - 1
        last = T - (KSIZE - 1) + js
        new = tl.load(x_base + last[:, None] * sx_t + offs_c[None, :],
                      mask=((last >= 0) & jmask)[:, None] & cmask[None, :], other=0.0).to(tl.float32)
        new += tl.load(cs_base + (KSIZE - 1 + last)[:, None], mask=((last < 0) & jmask)[:, None] & cmask[None, :],
                       other=0.0).to(tl.float32)
        tl.debug_barrier()                        # every read of the old state (this program's) before the write
        tl.store(cs_base + js[:, None], new.to(cs_ptr.dtype.element_ty), mask=jmask[:, None] & cmask[None, :])


def conv1d_config(T: int, C: int) -> dict:
    """Token and channel tiles: 8 to 16 tokens (>= K - 1: ``MAX_KERNEL``), up to 128 channels, 4 warps."""
    return dict(block_t=min(16, max(8, next_pow2(T))), block_c=min(128, next_pow2(C)), num_warps=4)


def causal_conv1d(x, weight, bias, conv_state, slots, *, silu: bool = True, out=None) -> torch.Tensor:
    """y [B, T, C] = (SiLU of, with ``silu``) the depthwise causal conv of x [B, T, C] by weight [C, K] (+ bias
    [C] or None), the first K - 1 inputs of each sequence from ``conv_state[slots[b]]`` [S, C, K - 1], which then
    holds its last K - 1 inputs."""
    check_tensor("x", x, (None, None, None), dtypes=FLOAT_DTYPES)
    B, T, C = x.shape
    check_tensor("weight", weight, (C, None), dtypes=FLOAT_DTYPES, device=x.device)
    K = weight.shape[1]
    if not 2 <= K <= MAX_KERNEL:
        raise ValueError(f"the conv kernel must have 2 to {MAX_KERNEL} taps, got {K}: a longer one needs a larger "
                         f"token block (conv1d_config).")
    if not weight.is_contiguous():
        raise ValueError("weight must be contiguous ([C, kernel]).")
    if bias is not None:
        check_tensor("bias", bias, (C,), dtypes=FLOAT_DTYPES, device=x.device)
    check_tensor("conv_state", conv_state, (None, C, K - 1), dtype=x.dtype, device=x.device)
    check_tensor("slots", slots, (B,), dtypes=(torch.int32, torch.int64), device=x.device)
    out = torch.empty(B, T, C, dtype=x.dtype, device=x.device) if out is None else out
    check_tensor("out", out, (B, T, C), dtype=x.dtype)
    c = conv1d_config(T, C)
    if B and T:
        launch(_conv1d_kernel, (B, cdiv(T, c["block_t"]), cdiv(C, c["block_c"])), x, weight,
               weight if bias is None else bias, conv_state, slots, out, T, C, x.stride(0), x.stride(1),
               out.stride(0), out.stride(1), conv_state.stride(0), conv_state.stride(1),
               KSIZE=K, BIAS=bias is not None, SILU=bool(silu), BLOCK_T=c["block_t"], BLOCK_C=c["block_c"],
               BLOCK_S=max(2, next_pow2(K - 1)), num_warps=c["num_warps"])
    return out


def torch_causal_conv1d_update(hidden_states, conv_state, weight, bias=None, activation="silu"):
    """transformers 5.24's ``causal_conv1d_update`` (hidden_states [B, C, T], conv_state [B, C, state_len] updated in
    place), SiLU for activation "silu"."""
    _, hidden_size, seq_len = hidden_states.shape
    state_len = conv_state.shape[-1]
    new = torch.cat([conv_state, hidden_states], dim=-1).to(weight.dtype)
    conv_state.copy_(new[:, :, -state_len:])
    out = Fn.conv1d(new, weight.unsqueeze(1), bias, padding=0, groups=hidden_size)[:, :, -seq_len:]
    if activation is not None:
        out = Fn.silu(out)
    return out.to(hidden_states.dtype)


def reference(x, weight, bias, conv_state, slots, *, silu: bool = True) -> torch.Tensor:
    """``causal_conv1d`` in torch: transformers' conv update on the slots' gathered states, scattered back."""
    cs = conv_state[slots]
    y = torch_causal_conv1d_update(x.transpose(1, 2), cs, weight, bias, "silu" if silu else None)
    conv_state[slots] = cs
    return y.transpose(1, 2)


def cost(tokens, batch, channels, kernel, dtype="bf16", *, reads_state=False, bias=False):
    return F.causal_conv1d(tokens, batch, channels, kernel, act_dtype=dtype if isinstance(dtype, str)
                           else dtype_name(dtype), reads_state=reads_state, bias=bias)
