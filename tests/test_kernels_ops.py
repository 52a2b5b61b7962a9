"""Kernel correctness under the Triton interpreter: fp32/fp16 exact logic, bf16 with upcasting.

Run: pytest tests/test_kernels_ops.py   (CPU; TRITON_INTERPRET=1 is set by kernels.env)
"""

import math

import pytest
import torch

import kernels  # noqa: F401  (sets TRITON_INTERPRET before triton loads)
from kernels import decode_attention as DA
from kernels import linear as L
from kernels import prefill_attention as PA
from kernels import rmsnorm as N
from kernels import rope as P
from kernels.check import KERNEL_TOL, run_checks
from kernels.check_result import rel_err

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.fixture
def rng():
    return torch.Generator().manual_seed(0)


def rnd(g, *shape, dtype=torch.float32):
    return torch.randn(*shape, generator=g).to(dtype)


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_run_checks_every_kernel_passes(dtype):
    res = run_checks("triton", dtype, parts=("kernels",))
    names = {r.name.split()[0] for r in res}
    assert {"linear", "rmsnorm", "add_rmsnorm", "rope", "swiglu", "residual_add", "embedding", "kv_append",
            "prefill_attn", "decode_attn", "relu2"} <= names
    assert {r.name for r in res} >= {"moe_experts T=37 E=6 k=2 relu2", "moe_experts T=5 E=4 k=3 relu2 +bias"}
    bad = [str(r) for r in res if not r.passed]
    assert not bad, bad
    assert all(r.tol == KERNEL_TOL[dtype] for r in res)
    assert max(r.max_rel_err for r in res) <= KERNEL_TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M,Nn,K,cfg", [(45, 33, 70, dict(block_m=16, block_n=16, block_k=16)),
                                        (2, 100, 257, dict(block_k=16, split_k=5)),
                                        (64, 40, 50, {}), (65, 20, 30, dict(block_m=32, block_n=16, block_k=16))])
def test_linear_matches_reference(rng, dtype, M, Nn, K, cfg):
    x, w = rnd(rng, M, K, dtype=dtype), rnd(rng, K, Nn, dtype=dtype)
    out = torch.full((M, Nn), math.nan, dtype=dtype)
    L.linear(x, w, out=out, **cfg)
    assert rel_err(out, x.double() @ w.double()) <= TOL[dtype]


def test_linear_split_k_decode_config():
    # M <= 64 takes the skinny path: BLOCK_M = max(16, next_pow2(M)), several K splits
    c = L.linear_config(1, 4096, 4096, torch.bfloat16)
    assert (c["block_m"], c["block_n"]) == (16, 64)
    # 2 * 4 interpreter "SMs" = 8 programs wanted, 64 column tiles -> no split needed
    assert c["split_k"] == 1
    c = L.linear_config(3, 64, 4096, torch.bfloat16, split_k=4)
    assert c["split_k"] == 4 and c["k_per_split"] == 1024  # 32 K-iterations of 128 / 4
    assert L.linear_config(1024, 4096, 4096, torch.bfloat16)["block_m"] == 128


def test_poisoned_output_is_caught():
    out = torch.full((3, 4), math.nan)
    assert rel_err(out, torch.ones(3, 4)) == math.inf
    out[:2] = 1.0  # one row left unwritten
    assert rel_err(out, torch.ones(3, 4)) == math.inf


def test_rope_rotates_like_hf_rotate_half():
    cos, sin = P.rope_tables(8, 4, 10000.0)
    q = torch.tensor([[[1.0, 0.0, 0.0, 0.0]]])   # x1 = [1, 0], x2 = [0, 0]
    k = torch.tensor([[[0.0, 0.0, 1.0, 0.0]]])   # x2 = [1, 0]
    P.rope(q, k, cos, sin, torch.tensor([1]))
    # position 1, freq 1: q -> [cos1, 0, sin1, 0]; k -> [-sin1, 0, cos1, 0]
    c, s = math.cos(1.0), math.sin(1.0)
    assert torch.allclose(q[0, 0], torch.tensor([c, 0.0, s, 0.0]), atol=1e-6)
    assert torch.allclose(k[0, 0], torch.tensor([-s, 0.0, c, 0.0]), atol=1e-6)


def test_add_rmsnorm_equals_unfused_pair(rng):
    x, r, w = rnd(rng, 5, 40, dtype=torch.float16), rnd(rng, 5, 40, dtype=torch.float16), rnd(rng, 40, dtype=torch.float16)
    h, y = N.add_rmsnorm(x, r, w)
    assert torch.equal(h, x + r)
    assert torch.equal(y, N.rmsnorm(h, w))


def test_prefill_attention_with_prefix_equals_full_causal_rows(rng):
    # queries at positions 9..20 over a 21-key cache == the last 12 rows of a full causal pass
    kc, vc, q = rnd(rng, 1, 2, 32, 16), rnd(rng, 1, 2, 32, 16), rnd(rng, 1, 21, 4, 16)
    slots = torch.tensor([0])
    full = PA.prefill_attention(q, kc, vc, slots, 0, block_m=16, block_n=16)
    part = PA.prefill_attention(q[:, 9:].contiguous(), kc, vc, slots, 9, block_m=16, block_n=16)
    assert rel_err(part, full[:, 9:]) <= 1e-6


def test_decode_attention_split_count_does_not_change_result(rng):
    kc, vc, q = rnd(rng, 2, 2, 128, 16), rnd(rng, 2, 2, 128, 16), rnd(rng, 2, 8, 16)
    lens, slots = torch.tensor([100, 17]), torch.tensor([1, 0])
    outs = [DA.decode_attention(q, kc, vc, lens, slots, block_n=16, splits=s) for s in (1, 3, 7)]
    assert DA.decode_config(2, 2, 100, block_n=16, splits=3)["split_size"] == 48  # cdiv(cdiv(100,3),16)*16
    for o in outs[1:]:
        assert rel_err(o, outs[0]) <= 1e-6


def test_decode_config_from_batch_heads_length():
    # interpreter: 4 "SMs" x 4 resident programs -> cdiv(16, B*Hkv) splits per (b, head), each >= 1 tile of 64
    assert DA.decode_config(1, 1, 4096)["splits"] == 16
    assert DA.decode_config(1, 1, 100)["splits"] == 2        # cdiv(100, 64) = 2 tiles
    assert DA.decode_config(32, 8, 4096)["splits"] == 1      # 256 programs already
    c = DA.decode_config(1, 8, 4096, dtype=torch.float32)    # fp32: 32-key tiles and 8 warps (no spills)
    assert (c["block_n"], c["num_warps"]) == (32, 8)


# ---- bad inputs: ValueError naming the tensor, expected and received -----------------------
def test_linear_bad_shapes():
    with pytest.raises(ValueError, match=r"x must have shape \[\.\.\., 8\].*got \[3, 7\]"):
        L.linear(torch.zeros(3, 7), torch.zeros(8, 4))
    with pytest.raises(ValueError, match="x must have dtype torch.float32, got torch.float16"):
        L.linear(torch.zeros(3, 8, dtype=torch.float16), torch.zeros(8, 4))
    with pytest.raises(ValueError, match=r"w must have shape \[\*, \*\], got \[8\]"):
        L.linear(torch.zeros(3, 8), torch.zeros(8))


def test_attention_bad_shapes():
    kc = torch.zeros(2, 2, 16, 16)
    with pytest.raises(ValueError, match=r"k_cache must have shape \[\*, \*, \*, 8\], got \[2, 2, 16, 16\]"):
        PA.prefill_attention(torch.zeros(1, 3, 4, 8), kc, kc, torch.tensor([0]))
    with pytest.raises(ValueError, match=r"q's heads \(3\) must be a multiple"):
        DA.decode_attention(torch.zeros(1, 3, 16), kc, kc, torch.tensor([4]), torch.tensor([0]))
    with pytest.raises(ValueError, match=r"lengths must have shape \[2\], got \[1\]"):
        DA.decode_attention(torch.zeros(2, 4, 16), kc, kc, torch.tensor([4]), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="exceed the cache length 16"):
        DA.decode_attention(torch.zeros(1, 4, 16), kc, kc, torch.tensor([17]), torch.tensor([0]))
    with pytest.raises(ValueError, match="do not fit the cache length 16"):
        PA.prefill_attention(torch.zeros(1, 10, 4, 16), kc, kc, torch.tensor([0]), 7)


def test_norm_rope_bad_shapes():
    with pytest.raises(ValueError, match=r"x must have shape \[\.\.\., 8\] to match the weight \[8\], got \[2, 4\]"):
        N.rmsnorm(torch.zeros(2, 4), torch.ones(8))
    cos, sin = P.rope_tables(8, 4)
    with pytest.raises(ValueError, match=r"k must have shape \[2, \*, 4\], got \[3, 1, 4\]"):
        P.rope(torch.zeros(2, 2, 4), torch.zeros(3, 1, 4), cos, sin, torch.tensor([0, 1]))
