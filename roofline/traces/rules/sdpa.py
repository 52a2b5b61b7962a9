"""Trace cost rules for attention: scaled-dot-product attention and its flash / efficient / cudnn / math
variants, ``aten::_flash_attention_forward``, ``aten::_efficient_attention_forward``,
``flash_attn::_flash_attn_forward`` and its varlen form for one sequence.

-> ``formulas.prefill_attention`` (S_q > 1; halved when causal) or ``formulas.decode_attention``
(S_q = 1). Causal comes from the recorded ``is_causal``; with an explicit mask and S_q > 1 it is
*assumed* causal (a decoder's mask), and the signature says "causal assumed". A batch of varlen
sequences and paged attention are not costed here: their lengths are tensor values, not shapes (paged attention
kernels are costed from the engine step's mix: ``rules.vllm``).
"""

from __future__ import annotations

from ... import formulas as F
from ..registry import rule

# name -> (layout "bhsd" or "bshd", index of is_causal in Concrete Inputs, index of a mask input or None)
SDPA = {"aten::scaled_dot_product_attention": ("bhsd", 5, 3),
        "aten::_scaled_dot_product_flash_attention": ("bhsd", 4, None),
        "aten::_scaled_dot_product_flash_attention_for_cpu": ("bhsd", 4, 5),
        "aten::_scaled_dot_product_efficient_attention": ("bhsd", 6, 3),
        "aten::_scaled_dot_product_cudnn_attention": ("bhsd", 6, 3),
        "aten::_scaled_dot_product_attention_math": ("bhsd", 5, 3),
        "aten::_flash_attention_forward": ("bshd", 8, None),
        "flash_attn::_flash_attn_forward": ("bshd", 5, None)}


def attention(a, q, k, v, causal, masked, layout):
    """Attention of recorded q, k, v (shape, dtype) in ``layout``; None for shapes it cannot read."""
    if q is None or k is None or v is None:
        return None
    (sq, tq), (sk, tk) = q, k
    if len(sq) != 4 or len(sk) != 4:
        return None
    if layout == "bhsd":
        b, hq, s_q, d = sq
        hkv, s_kv = sk[1], sk[2]
    else:
        b, s_q, hq, d = sq
        s_kv, hkv = sk[1], sk[2]
    if hkv <= 0 or hq % hkv or s_kv < 1 or s_q < 1:
        return None
    note = ""
    if s_q == 1:
        cost = F.decode_attention(b, s_kv, hq, hkv, d, act_dtype=tq, kv_dtype=tk, kv_scales=False)
    else:
        if causal is None or (not causal and masked):
            causal, note = True, "causal assumed"
        cached = max(s_kv - s_q, 0) if causal else 0
        cost = F.prefill_attention(b, s_q, hq, hkv, d, cached_tokens=cached, causal=causal, act_dtype=tq,
                                   kv_dtype=tk, kv_scales=False)   # NB: a framework's 8-bit cache: per-tensor scales
        if causal and s_kv < s_q:
            return None
    sig = f"b{b} q{s_q} kv{s_kv} h{hq}/{hkv} d{d} {tq}" + (" causal" if causal and s_q > 1 else "")
    return a.op(cost, tq, sig + (f" ({note})" if note else ""), note,
                {"batch": b, "s_q": s_q, "s_kv": s_kv, "n_heads": hq, "n_kv_heads": hkv, "head_dim": d,
                 "causal": bool(causal)})


@rule(tuple(SDPA), category="attention", tensor_cores=True)
def sdpa(a):
    t = a.tensor
    layout, ci, mi = SDPA[a.name]
    masked = mi is not None and t(mi) is not None and bool(t(mi)[0])
    return attention(a, t(0), t(1), t(2), a.flag(ci), masked, layout)


@rule("aten::_efficient_attention_forward", category="attention", tensor_cores=True)
def efficient_attention(a):
    mask = a.integer(9)
    return attention(a, a.tensor(0), a.tensor(1), a.tensor(2), None if mask is None else mask > 0, False, "bshd")


@rule("flash_attn::_flash_attn_varlen_forward", category="attention", tensor_cores=True)
def flash_varlen(a):
    """One sequence only (cu_seqlens of 2 entries): a batch's lengths are tensor values."""
    q, k, cu = a.tensor(0), a.tensor(1), a.tensor(3)
    if q is None or k is None or cu is None or cu[0] != (2,):
        return None
    return attention(a, ((1,) + q[0], q[1]), ((1,) + k[0], k[1]), k, a.flag(9), False, "bshd")
