"""Verify attention (issue 34): speculative decoding's verify step, k + 1 queries per sequence over its cache,
causal among them, on both backends (the Triton kernel under the interpreter here), against its reference, the
chunked-prefill reference, and the check rows' power to catch a causal mask off by one."""

from __future__ import annotations

import pytest
import torch

from kernels import check as CK
from kernels import decode_attention as DA
from kernels import prefill_attention as PA
from kernels.backend import get_ops
from kernels.check_result import rel_err
from roofline import formulas as F

TOL = CK.KERNEL_TOL["fp32"]


def _inputs(seed=0, B=3, T=4, Hq=4, Hkv=2, D=16, L=64):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    return r(4, Hkv, L, D), r(4, Hkv, L, D), r(B, T, Hq, D)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_check_rows_pass(backend):
    rows = [CK._result(n, rel_err(o, r), TOL, d) for n, o, r, d in
            CK._verify_checks(get_ops(backend), torch.device("cpu"), *_rnd_nan(), backend == "triton")]
    assert len(rows) == len(CK.VERIFY_CASES) == 5
    assert all(r.passed for r in rows), [str(r) for r in rows if not r.passed]


def _rnd_nan():
    g = torch.Generator().manual_seed(1234)
    rnd = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    nan = lambda *s: torch.full(s, float("nan"))  # noqa: E731
    return rnd, nan


@pytest.mark.parametrize("shift", [-1, 1])
def test_a_mask_off_by_one_fails_the_check(monkeypatch, shift):
    """Every check case's kernel output against a reference whose queries see one key fewer / more than their
    position allows: each misses the tolerance by orders of magnitude (so a kernel with that bug fails)."""
    rnd, nan = _rnd_nan()
    outs = list(CK._verify_checks(get_ops("triton"), torch.device("cpu"), rnd, nan, True))
    good = DA.verify_visible

    def shifted(lengths, n_queries, S, window=None):
        return good(lengths + shift, n_queries, S, window)

    monkeypatch.setattr(DA, "verify_visible", shifted)
    rnd, nan = _rnd_nan()                          # the same draws again: the same inputs, the shifted reference
    bad = list(CK._verify_checks(get_ops("torch"), torch.device("cpu"), rnd, nan, False))
    for (name, o, _, _), (_, _, ref, _) in zip(outs, bad):
        assert rel_err(o, ref) > 100 * TOL, name


def test_equals_chunked_prefill_over_a_cached_prefix():
    """One prefix length for the whole batch: the verify step is prefill_attention's chunk after ``cached``."""
    kc, vc, q = _inputs()
    slots, cached = torch.tensor([3, 0, 1]), 33
    lens = torch.full((3,), cached + 4)
    ref = PA.reference(q.double(), kc.double(), vc.double(), slots, cached)
    for o in (DA.verify_attention(q, kc, vc, lens, slots, block_n=16, splits=3), DA.torch_verify(q, kc, vc, lens, slots),
              PA.prefill_attention(q, kc, vc, slots, cached, block_m=16, block_n=16)):
        assert rel_err(o, ref) <= TOL


def test_last_query_is_decode_and_first_sees_only_its_prefix():
    """Query T-1 sees every key (= decode attention at the full length); query 0 = decode at length - T + 1."""
    kc, vc, q = _inputs(1)
    slots, lens = torch.tensor([2, 1, 0]), torch.tensor([20, 4, 47])
    o = DA.verify_attention(q, kc, vc, lens, slots, block_n=16)
    assert rel_err(o[:, -1], DA.reference(q[:, -1].double(), kc.double(), vc.double(), lens, slots)) <= TOL
    assert rel_err(o[:, 0], DA.reference(q[:, 0].double(), kc.double(), vc.double(), lens - 3, slots)) <= TOL


def test_int8_cache_matches_dequantized_reference():
    from kernels.quant import quantize_kv_rows

    kf, vf, q = _inputs(2)
    (kq, ks), (vq, vs) = quantize_kv_rows(kf, "int8"), quantize_kv_rows(vf, "int8")
    slots, lens = torch.tensor([0, 1, 2]), torch.tensor([30, 64, 5])
    ref = DA.verify_reference(q.double(), kq, vq, lens, slots, scales=(ks, vs))
    assert rel_err(DA.verify_attention(q, kq, vq, lens, slots, scales=(ks, vs), block_n=16), ref) <= TOL
    assert rel_err(DA.torch_verify(q, kq, vq, lens, slots, scales=(ks, vs)), ref) <= TOL


def test_config_rows_and_programs():
    c = DA.verify_config(2, 4, 32, 8, 1024, block_n=64)        # T x G = 16 rows: one block of 16
    assert (c["block_r"], c["row_blocks"]) == (16, 1)
    c = DA.verify_config(1, 6, 64, 4, 1024, block_n=64)        # 6 x 16 = 96 rows: two blocks of 64
    assert (c["block_r"], c["row_blocks"]) == (64, 2)
    assert c["programs"] == 1 * 4 * 2 * c["splits"]


def test_out_must_be_contiguous_per_sequence():
    kc, vc, q = _inputs()
    bad = torch.empty(3, 4, 4, 16).transpose(1, 2).contiguous().transpose(1, 2)   # [B, T, Hq, D], T slowest
    with pytest.raises(ValueError, match="one stride"):
        DA.verify_attention(q, kc, vc, torch.tensor([9, 9, 9]), torch.tensor([0, 1, 2]), out=bad)


def test_cost_is_the_verify_steps_attention():
    """B chunks of k + 1 after ``context`` (workload.mixed, roofline.speculative.verify_step): B x one chunk's."""
    c = DA.verify_cost(4, 1000, 3, 32, 8, 128)
    one = F.prefill_attention(1, 4, 32, 8, 128, cached_tokens=1000)
    assert (c.flops, c.bytes) == (4 * one.flops, 4 * one.bytes)
    # pairs by the halving convention (formulas.causal_pairs): 4 x 1000 + 4 x 4 / 2 = 4008 (the exact count, 4010,
    # keeps the diagonal); FLOPs 4 x B x Hq x D x pairs
    assert c.flops == 4 * 4 * 32 * 128 * 4008
