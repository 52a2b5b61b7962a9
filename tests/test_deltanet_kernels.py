"""Gated DeltaNet's kernels (kernels/deltanet.py, issue 32) under the interpreter, against their torch references,
and the references against transformers 5.24's own torch fallbacks (modeling_qwen3_next.py); the slot states read
and written; a 1% wrong decay or gate moves the output far past the tolerance."""

from __future__ import annotations

import pytest
import torch

from kernels import conv1d as CV
from kernels import deltanet as DN

M = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")

B, T, HK, HV, DK, DV = 2, 37, 2, 4, 16, 24
SLOTS = torch.tensor([2, 0])


def inputs(seed=0, t=T):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(B, t, HK, DK, generator=g), torch.randn(B, t, HK, DK, generator=g)
    v = torch.randn(B, t, HV, DV, generator=g)
    decay, beta = -torch.rand(B, t, HV, generator=g) * 0.5, torch.rand(B, t, HV, generator=g)
    init = torch.randn(B, HV, DK, DV, generator=g) * 0.3
    return q, k, v, decay, beta, init


def states(init):
    s = torch.zeros(3, HV, DK, DV)
    s[SLOTS] = init
    return s


def err(a, b):
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("has_state", [False, True])
def test_the_chunked_rule_equals_transformers(has_state):
    q, k, v, g, beta, init = inputs()
    theirs, final = M.torch_chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=16,
                                                   initial_state=init if has_state else None,
                                                   output_final_state=True, use_qk_l2norm_in_kernel=True)
    for fn in (DN.gated_delta_prefill, DN.chunk_reference):          # three chunks of 16, the last partial
        s = states(init)
        ours = fn(q, k, v, g, beta, s, SLOTS, has_state=has_state, chunk=16)
        assert err(ours, theirs) < 1e-5 and err(s[SLOTS], final) < 1e-5
        assert torch.equal(s[1], torch.zeros(HV, DK, DV))             # another slot's state untouched


def test_the_chunk_of_64_and_the_recurrent_step_agree_with_transformers():
    q, k, v, g, beta, init = inputs(1, t=70)
    theirs, final = M.torch_chunk_gated_delta_rule(q, k, v, g, beta, initial_state=init, output_final_state=True,
                                                   use_qk_l2norm_in_kernel=True)
    s = states(init)
    assert err(DN.gated_delta_prefill(q, k, v, g, beta, s, SLOTS, has_state=True), theirs) < 1e-5
    assert err(s[SLOTS], final) < 1e-5
    one, after = M.torch_recurrent_gated_delta_rule(q[:, :1], k[:, :1], v[:, :1], g[:, :1], beta[:, :1],
                                                    initial_state=init, output_final_state=True,
                                                    use_qk_l2norm_in_kernel=True)
    for fn in (DN.gated_delta_decode, DN.recurrent_reference):
        s = states(init)
        ours = fn(q[:, 0], k[:, 0], v[:, 0], g[:, 0].contiguous(), beta[:, 0].contiguous(), s, SLOTS)
        assert err(ours, one[:, 0]) < 1e-5 and err(s[SLOTS], after) < 1e-5


def test_a_one_percent_decay_or_gate_is_caught():
    q, k, v, g, beta, init = inputs(2)
    good = DN.gated_delta_prefill(q, k, v, g, beta, states(init), SLOTS, has_state=True, chunk=16)
    for g2, b2 in ((g * 1.01, beta), (g, beta * 1.01)):
        bad = DN.gated_delta_prefill(q, k, v, g2, b2, states(init), SLOTS, has_state=True, chunk=16)
        assert err(bad, good) > 1e-3


@pytest.mark.parametrize("t", [1, 2, 9])
def test_the_conv_with_its_state_equals_transformers_update(t):
    C, K = 20, 4
    gen = torch.Generator().manual_seed(t)
    x, w, cs = torch.randn(B, t, C, generator=gen), torch.randn(C, K, generator=gen), torch.randn(3, C, K - 1,
                                                                                                   generator=gen)
    full = torch.cat([torch.zeros(B, C, 1), cs[SLOTS]], dim=-1)        # transformers' state keeps kernel inputs
    theirs = M.causal_conv1d_update(x.transpose(1, 2), full, w, None, "silu").transpose(1, 2)
    for fn in (CV.causal_conv1d, CV.reference):      # kernels.conv1d's, with no bias
        s = cs.clone()
        assert err(fn(x, w, None, s, SLOTS), theirs) < 1e-6
        assert torch.equal(s[SLOTS], full[:, :, 1:]) and torch.equal(s[1], cs[1])


def test_gates_norm_and_output_gate():
    gen = torch.Generator().manual_seed(3)
    a, b = torch.randn(5, HV, generator=gen) * 10, torch.randn(5, HV, generator=gen)
    a_log, dt = torch.randn(HV, generator=gen), torch.randn(HV, generator=gen)
    g1, b1 = DN.delta_gates(a, b, a_log, dt)
    g2, b2 = DN.gates_reference(a, b, a_log, dt)
    assert err(g1, g2) < 1e-6 and err(b1, b2) < 1e-6 and g1.dtype == torch.float32
    x, z, w = torch.randn(7, DV, generator=gen), torch.randn(7, DV, generator=gen), torch.randn(DV, generator=gen)
    norm = M.Qwen3NextRMSNormGated(DV)
    norm.weight.data.copy_(w)
    with torch.no_grad():
        theirs = norm(x, z)
    assert torch.equal(DN.gated_norm_reference(x, z, w), theirs) and err(DN.gated_rmsnorm(x, z, w), theirs) < 1e-6
    assert err(DN.sigmoid_gate(x, z), x * torch.sigmoid(z)) < 1e-6


def test_costs_are_the_formulas():
    from roofline import formulas as F
    assert DN.prefill_cost(2, 100, 2, 4, 8, 12, "bf16") == F.gated_delta_prefill(2, 100, 2, 4, 8, 12)
    assert DN.decode_cost(2, 2, 4, 8, 12, torch.float32) == F.gated_delta_decode(2, 2, 4, 8, 12, act_dtype="fp32")


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_roofline_checks_rows_fail_on_a_one_percent_gate_or_decay(backend):
    """kernels.check_deltanet's rows pass as they are and fail (past fp32's 1e-5) with beta or g 1% off: every row
    that reads the gate, or the decay."""
    from kernels.backend import get_ops
    from kernels.check_deltanet import TOL, deltanet_rows
    from kernels.check_result import rel_err

    ops, cpu = get_ops(backend), torch.device("cpu")
    rows = lambda **kw: {n: rel_err(o, r) for n, o, r, _ in deltanet_rows(ops, torch.float32, cpu, **kw)}  # noqa: E731
    assert max(rows().values()) <= TOL["fp32"]
    for kw, reads in (({"gate_error": 0.01}, ("gated_delta", "beta", "gated_rmsnorm", "sigmoid_gate")),
                      ({"decay_error": 0.01}, ("gated_delta", "delta_gates g"))):
        failed = {n for n, e in rows(**kw).items() if e > TOL["fp32"]}
        assert failed == {n for n in rows() if any(w in n for w in reads)} and len(failed) >= 4, (kw, failed)
