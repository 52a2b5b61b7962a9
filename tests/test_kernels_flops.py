"""Our FLOP formulas against torch.utils.flop_counter.FlopCounterMode on the reference ops.

FlopCounterMode counts matmuls (and SDPA) only and ignores attention masks. Linear and
non-causal attention agree exactly; causal attention counts twice ours, because our formula
(formulas.causal_pairs) halves the S x S score matrix for the mask while FlopCounterMode
charges the full matrix. (F.scaled_dot_product_attention on a CPU dispatches to a kernel
FlopCounterMode does not register, so the plain-matmul references are what is counted here.)

Run: pytest tests/test_kernels_flops.py
"""

import torch
from torch.utils.flop_counter import FlopCounterMode

import kernels  # noqa: F401
from kernels import decode_attention as DA
from kernels import linear as L
from kernels import prefill_attention as PA


def counted(fn, *args, **kw):
    with FlopCounterMode(display=False) as fc:
        fn(*args, **kw)
    return fc.get_total_flops()


def test_linear_flops_match():
    x, w = torch.randn(7, 48), torch.randn(48, 40)
    assert counted(L.reference, x, w) == 2 * 7 * 48 * 40 == 26880
    assert L.cost(7, 48, 40, "fp32").flops == 26880


def test_noncausal_attention_flops_match():
    B, n, Hq, Hkv, D, p = 2, 9, 4, 2, 16, 5
    q, kc = torch.randn(B, n, Hq, D), torch.randn(2, Hkv, 32, D)
    slots = torch.tensor([1, 0])
    ours = PA.cost(B, n, Hq, Hkv, D, cached=p, causal=False, dtype="fp32").flops
    assert ours == 4 * B * Hq * n * (p + n) * D == 64512  # 4 * 2 * 4 * 9 * 14 * 16
    assert counted(PA.reference, q, kc, kc, slots, p, causal=False) == ours


def test_causal_attention_flopcounter_is_twice_ours():
    B, n, Hq, Hkv, D = 1, 12, 4, 1, 16
    q, kc = torch.randn(B, n, Hq, D), torch.randn(1, Hkv, 16, D)
    slots = torch.tensor([0])
    ours = PA.cost(B, n, Hq, Hkv, D, causal=True, dtype="fp32").flops
    assert ours == 4 * B * Hq * D * n * n / 2 == 18432   # halved for the causal mask
    # FlopCounterMode charges every (query, key) pair, masked or not: 2x ours
    assert counted(PA.reference, q, kc, kc, slots, 0, causal=True) == 2 * ours


def test_decode_attention_flops_match():
    B, Hq, Hkv, D, S = 3, 8, 2, 16, 20
    q, kc = torch.randn(B, Hq, D), torch.randn(3, Hkv, 32, D)
    lens, slots = torch.full((B,), S), torch.tensor([2, 0, 1])
    ours = DA.cost(B, S, Hq, Hkv, D, dtype="fp32").flops
    assert ours == 4 * B * Hq * S * D == 30720
    assert counted(DA.torch_decode, q, kc, kc, lens, slots, max_len=S) == ours
