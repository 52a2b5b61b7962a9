"""DeepSeek Sparse Attention's kernels (``kernels.dsa``, issue 32): the indexer's scores kernel and top-k, the
sparse absorbed MLA decode, the top-k-masked prefill, their costs, and the ``roofline check`` rows that fail
when the selection or a weight is off. Triton interpreted here (tiny shapes).

Run: pytest tests/test_dsa_kernels.py
"""

from __future__ import annotations

import math

import pytest
import torch

from kernels import dsa as D
from kernels import mla as MLA
from kernels.backend import get_ops
from kernels.check import run_checks
from roofline import formulas as F


def _inputs(seed=0, T=5, Hi=8, Di=24, L=70):
    g = torch.Generator().manual_seed(seed)
    q, w, kc = (torch.randn(*s, generator=g) for s in ((T, Hi, Di), (T, Hi), (3, L, Di)))
    return q, w, kc, torch.tensor([2, 0, 1, 2, 0]), torch.tensor([1, 13, 70, 65, 0])


def test_the_scores_kernel_is_transformers_sum_of_relu_products():
    q, w, kc, slots, lim = _inputs()
    got = D.index_scores(q, w, kc, slots, lim, max_len=70, block_n=16)
    ref = D.scores_reference(q, w, kc, slots, lim, max_len=70)
    # one entry by hand: query 1 (slot 0) against key 4, sum_h w_h relu(q_h . k / sqrt(24))
    hand = sum(float(w[1, h]) * max(float(q[1, h] @ kc[0, 4]) / math.sqrt(24), 0.0) for h in range(8))
    assert got.shape == (5, 70) and abs(float(got[1, 4]) - hand) < 1e-5
    assert torch.equal(torch.isinf(got), torch.isinf(ref)) and torch.isinf(got).sum() == 69 + 57 + 0 + 5 + 70
    fin = torch.isfinite(ref)
    assert (got[fin] - ref[fin]).abs().max() < 1e-5 * ref[fin].abs().max()
    off = D.scores_reference(q, w * 1.01, kc, slots, lim, max_len=70)       # a head weight 1% off: seen
    assert (off[fin] - got[fin]).abs().max() > 1e-4 * ref[fin].abs().max()


def test_top_k_keeps_the_highest_visible_keys_and_marks_the_rest():
    q, w, kc, slots, lim = _inputs()
    sc = D.scores_reference(q, w, kc, slots, lim, max_len=70)
    idx = D.index_topk(sc, 6)
    assert idx.shape == (5, 6) and idx.dtype == torch.int32
    assert idx[0].tolist() == [0, -1, -1, -1, -1, -1] and idx[4].tolist() == [-1] * 6      # 1 and 0 visible keys
    for t in (1, 2, 3):
        best = sorted(range(int(lim[t])), key=lambda j: -float(sc[t, j]))[:6]
        assert sorted(idx[t].tolist()) == sorted(best) and max(best) < int(lim[t])
    keep = D.selection_mask(idx, 70)
    assert keep.sum(1).tolist() == [1, 6, 6, 6, 0] and bool(keep[0, 0])


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_sparse_decode_over_every_key_is_the_dense_decode(backend):
    """Selecting every key (in any order) gives kernels.mla's dense decode; holes (-1) are skipped; no
    selection gives zeros."""
    g = torch.Generator().manual_seed(1)
    B, H, R, P, L = 2, 20, 32, 16, 40
    ql, qp, ckv, kpe = (torch.randn(*s, generator=g) for s in ((B, H, R), (B, H, P), (3, L, R), (3, L, P)))
    slots, lens = torch.tensor([2, 0]), torch.tensor([37, 9])
    idx = torch.full((B, 40), -1, dtype=torch.int32)
    idx[0, :37] = torch.randperm(37, generator=g).to(torch.int32)
    idx[1, 5:14] = torch.arange(8, -1, -1, dtype=torch.int32)
    ops = get_ops(backend)
    cfg = dict(block_n=16, splits=3) if backend == "triton" else {}
    got = ops.mla_sparse_decode(ql, qp, ckv, kpe, idx, slots, sm_scale=0.2, **cfg)
    dense = MLA.reference(ql, qp, ckv, kpe, lens, slots, sm_scale=0.2)
    assert (got - dense).abs().max() < 1e-5
    none = ops.mla_sparse_decode(ql, qp, ckv, kpe, torch.full((B, 4), -1, dtype=torch.int32), slots, sm_scale=0.2)
    assert torch.equal(none, torch.zeros_like(none))


def test_the_masked_prefill_is_transformers_dense_attention_under_the_top_k_mask():
    g = torch.Generator().manual_seed(2)
    n, cached, H, QK, V = 7, 5, 3, 24, 16
    q, k, v = (torch.randn(*s, generator=g) for s in ((1, n, H, QK), (1, cached + n, H, QK), (1, cached + n, H, V)))
    sc = torch.randn(n, cached + n, generator=g)
    sc = sc.masked_fill(torch.arange(cached + n)[None, :] > cached + torch.arange(n)[:, None], float("-inf"))
    keep = D.selection_mask(D.index_topk(sc, 4), cached + n)[None]
    got = MLA.mla_prefill(q, k, v, sm_scale=QK ** -0.5, cached=cached, keep=keep)
    s = torch.einsum("bnhd,bshd->bhns", q, k) * QK ** -0.5
    ref = torch.einsum("bhns,bshv->bnhv", s.masked_fill(~keep[:, None], float("-inf")).softmax(-1), v)
    assert (got - ref).abs().max() < 1e-5
    assert (got - MLA.mla_prefill(q, k, v, sm_scale=QK ** -0.5, cached=cached)).abs().max() > 1e-2


def test_the_kernels_costs_are_the_formulas():
    assert D.scores_cost(2, 1, 4095, 64, 128) == F.index_scores(2, 1, 4095, 64, 128)
    assert D.topk_cost(2, 1, 4095, 2048) == F.index_topk(2, 1, 4095, 2048)
    sparse = D.cost(2, 4096, 128, 512, 64, 2048)
    assert sparse == F.mla_decode_attention(2, 4096, 128, 512, 64, topk=2048)
    dense = F.mla_decode_attention(2, 2048, 128, 512, 64)        # the selected 2,048 read, and their indices
    assert (sparse.flops, sparse.bytes) == (dense.flops, dense.bytes + 2 * 2048 * 4)


ROWS = ("layernorm T=5 D=24", "index_scores T=5", "index_topk T=5 k=6", "mla_sparse_decode B=3")


def _dsa_rows(backend):
    return {r.name.split(" Hi=")[0].split(" K=")[0]: r for r in run_checks(backend=backend, dtype="fp32",
                                                                          parts=("kernels",))
            if r.name.startswith(("layernorm", "index_", "mla_sparse"))}


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_roofline_check_has_the_dsa_rows(backend):
    rows = _dsa_rows(backend)
    assert sorted(rows) == sorted(ROWS) and all(r.passed for r in rows.values())


def test_roofline_check_fails_when_a_weight_or_the_selection_is_off(monkeypatch):
    ops = get_ops("torch")
    good = ops.index_scores
    monkeypatch.setattr(ops, "index_scores", lambda q, w, *a, **kw: good(q, w * 1.01, *a, **kw))
    rows = _dsa_rows("torch")
    assert not rows["index_scores T=5"].passed and rows["mla_sparse_decode B=3"].passed

    def swapped(q, w, *a, **kw):       # one row's best key scored last: a selection one key off
        s = good(q, w, *a, **kw).clone()
        s[2, s[2].argmax()] = -1e9
        return s
    monkeypatch.setattr(ops, "index_scores", swapped)
    rows = _dsa_rows("torch")
    assert not rows["index_topk T=5 k=6"].passed
