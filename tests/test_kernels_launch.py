"""Launch shapes on a fake GPU: the launchers run on meta tensors inside ``recording(num_sms)``.

Nothing runs: each launch is recorded with its grid, constexprs and options, exactly as the
launcher computes them for an A100 (108 SMs) or an H100 (132 SMs). Plus the small fixes
(block sizes that cannot compile, length-0 decode, the torch peers' copy-free K/V).

Run: pytest tests/test_kernels_launch.py
"""

import math

import pytest
import torch

import kernels  # noqa: F401
from kernels import _common
from kernels import decode_attention as DA
from kernels import linear as L
from kernels import prefill_attention as PA
from kernels._launch import recording
from kernels.check_result import rel_err
from kernels.runners import make_runners
from roofline.models import load_model

META = torch.device("meta")
L3 = load_model("llama-3-8b")


def _record(fn, sms=132):
    with recording(sms) as rec:
        fn()
    return rec.launches


def test_recording_runs_nothing_and_fakes_the_sm_count():
    assert _common.num_sms("cpu") == 4
    with recording(108):
        assert _common.num_sms("cuda") == 108
        y = L.linear(torch.ones(3, 8), torch.ones(8, 4))        # real tensors: recorded, never computed
    assert _common.num_sms("cpu") == 4
    assert y.shape == (3, 4)
    with pytest.raises(ValueError, match="num_sms must be at least 1"):
        with recording(0):
            pass


def test_prefill_linear_fills_the_sms():
    # Llama-3-8B k_proj at batch 1 x 128 tokens: 128x128 tiles give 8 programs on 132 SMs.
    x, w = torch.empty(128, 4096, dtype=torch.bfloat16, device=META), torch.empty(4096, 1024, dtype=torch.bfloat16,
                                                                                  device=META)
    (ln,) = _record(lambda: L.linear(x, w))
    assert ln.programs >= 132, ln.grid
    with recording(132):
        c = L.linear_config(128, 1024, 4096, torch.bfloat16)
    assert c["programs"] == ln.programs and c["note"] == ""
    assert c["k_per_split"] // c["block_k"] >= c["num_stages"]
    # a big GEMM keeps the big tile and one split
    with recording(132):
        big = L.linear_config(4096, 4096, 4096, torch.bfloat16)
    assert (big["block_m"], big["block_n"], big["split_k"]) == (128, 128, 1)


def test_decode_linear_is_one_launch_with_enough_iterations_per_split():
    # decode k/v_proj of Llama-3-8B (M = 1, N = 1024, K = 4096): split-K in ONE launch
    x, w = torch.empty(1, 4096, dtype=torch.bfloat16, device=META), torch.empty(4096, 1024, dtype=torch.bfloat16,
                                                                                device=META)
    launches = _record(lambda: L.linear(x, w))
    assert len(launches) == 1, [ln.name for ln in launches]
    ln = launches[0]
    assert ln.constexprs["SPLIT_K"] and ln.grid[1] > 1 and ln.programs >= 132
    k_per_split, split = ln.args[8], ln.args[9]
    assert split == ln.grid[1]
    assert k_per_split // ln.constexprs["BLOCK_K"] >= ln.options["num_stages"]


def test_tiny_shapes_say_why_the_grid_is_short():
    with recording(132):
        c = L.linear_config(1, 32, 64, torch.bfloat16)
    assert c["programs"] < 132 and "programs for 132 SMs" in c["note"]


def test_decode_split_kv_fills_the_sms():
    for ctx in (1024, 4096):
        (r,) = make_runners(L3, "decode", 1, ctx, dtype="bf16", device=META, ops=["attention"])
        split, merge = _record(r.fn)
        assert split.name == "_decode_split_kernel" and split.programs >= 132, (ctx, split.grid)
        assert merge.grid == (1, L3.n_heads, 1)
    with recording(108):
        c = DA.decode_config(1, 8, 4097)
    assert c["programs"] >= 108


def test_causal_prefill_runs_the_heaviest_tiles_first():
    q = torch.empty(2, 300, 32, 128, dtype=torch.bfloat16, device=META)
    kc = torch.empty(2, 8, 300, 128, dtype=torch.bfloat16, device=META)
    slots = torch.arange(2, device=META)
    (causal,) = _record(lambda: PA.prefill_attention(q, kc, kc, slots, 0))
    (full,) = _record(lambda: PA.prefill_attention(q, kc, kc, slots, 0, causal=False))
    assert causal.constexprs["HEAVY_FIRST"] and not full.constexprs["HEAVY_FIRST"]
    assert causal.grid == (math.ceil(300 / 128) * 2 * 32, 1, 1)      # one axis: no 65,535 limit on B*Hq


def test_fp32_tiles_are_the_spill_free_ones():
    # found by `roofline check --compile` (tests/test_compile_check.py compiles them)
    assert PA.attention_config(4096, 128, torch.float32) == dict(block_m=32, block_n=16, num_warps=8, num_stages=2)
    with recording(108):
        c = L.linear_config(64, 4096, 4096, torch.float32)
    assert (c["block_k"], c["num_warps"]) == (32, 8)


@pytest.mark.parametrize("call,match", [
    (lambda: L.linear(torch.ones(4, 8), torch.ones(8, 4), block_k=8), "block_k must be a power of two of at least 16"),
    (lambda: L.linear_config(4, 4, 8, block_m=24), "block_m must be a power of two"),
    (lambda: PA.attention_config(64, 64, block_n=8), "block_n must be a power of two of at least 16"),
    (lambda: DA.decode_config(1, 1, 64, block_n=12), "block_n must be a power of two of at least 16"),
])
def test_block_sizes_that_cannot_compile_are_rejected(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_length_zero_sequence_in_a_ragged_decode_is_zeros(dtype):
    g = torch.Generator().manual_seed(3)
    kc, vc = (torch.randn(3, 2, 40, 16, generator=g).to(dtype) for _ in range(2))
    q = torch.randn(3, 4, 16, generator=g).to(dtype)
    lens, slots = torch.tensor([0, 33, 0]), torch.tensor([2, 0, 1])
    o = DA.decode_attention(q, kc, vc, lens, slots, block_n=16, splits=3)
    ref = DA.reference(q.double(), kc.double(), vc.double(), lens, slots)
    assert torch.isfinite(o).all() and torch.equal(o[0], torch.zeros_like(o[0])) and torch.equal(o[2], o[0])
    assert rel_err(o, ref) <= (1e-5 if dtype == torch.float32 else 1.6e-2)
    peer = DA.torch_decode(q, kc, vc, lens, slots, max_len=33)
    assert torch.isfinite(peer).all() and not peer[0].any()
    allzero = DA.decode_attention(q, kc, vc, torch.zeros(3, dtype=torch.long), slots, max_len=0,
                                  out=torch.full_like(q, math.nan))
    assert not allzero.any()


def test_torch_peers_read_the_cache_in_place():
    g = torch.Generator().manual_seed(4)
    kc = torch.randn(4, 2, 32, 16, generator=g)
    ident = torch.arange(3)
    view = _common.slot_rows(kc, ident, 20)
    assert view.data_ptr() == kc.data_ptr() and view.shape == (3, 2, 20, 16)       # a view: no copy
    other = torch.tensor([2, 0, 1])
    assert torch.equal(_common.slot_rows(kc, other, 20), kc[other, :, :20])
    ident[0] = 3                                                                     # written in place: re-checked
    assert torch.equal(_common.slot_rows(kc, ident, 20), kc[ident, :, :20])
    # both peers agree with the references (GQA 4 query heads per KV head, ragged decode lengths)
    vc, q = torch.randn(4, 2, 32, 16, generator=g), torch.randn(3, 8, 16, generator=g)
    lens, slots = torch.tensor([20, 7, 13]), torch.arange(3)
    assert rel_err(DA.torch_decode(q, kc, vc, lens, slots, max_len=20), DA.reference(q, kc, vc, lens, slots)) < 1e-5
    qp = torch.randn(2, 9, 8, 16, generator=g)
    for cached in (0, 5):
        ref = PA.reference(qp, kc, vc, torch.arange(2), cached)
        assert rel_err(PA.sdpa(qp, kc, vc, torch.arange(2), cached), ref) < 1e-5
