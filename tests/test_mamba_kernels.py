"""The Mamba-2 kernels (kernels.mamba, kernels.conv1d) and our torch references against transformers 5.24's own torch
path (modeling_nemotron_h.py: mamba2_chunk_scan, mamba2_selective_state_update, causal_conv1d_fn / _update,
NemotronHRMSNormGated) on the same random inputs, fp32 at 1e-4: a prefill whose length is no multiple of
chunk_size, from zeros and from a slot's state, then decode steps continuing from the prefill's state; the Triton
kernels under the interpreter at tiny shapes."""

import pytest
import torch

from kernels import conv1d as CV
from kernels import mamba as M

TM = pytest.importorskip("transformers.models.nemotron_h.modeling_nemotron_h")

TOL = 1e-4
B, H, P, G, N, CHUNK = 2, 4, 8, 2, 16, 16
LIMIT = (0.001, float("inf"))          # Nemotron-H's time_step_limit (time_step_min, inf)


def close(a, b, tol=TOL):
    a, b = a.double(), b.double()
    assert a.shape == b.shape
    err = float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
    assert err <= tol, err


@pytest.fixture
def inputs():
    g = torch.Generator().manual_seed(32)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    return dict(a_log=torch.rand(H, generator=g).mul(3).log1p(), dt_bias=r(H) * 0.5, D=r(H), state=r(3, H, P, N) * 0.3,
                slots=torch.tensor([2, 0]), r=r)


def _hf_prefill(x, dt, Bm, Cm, p, init):
    return TM.mamba2_chunk_scan(x, dt, -torch.exp(p["a_log"]), Bm, Cm, chunk_size=CHUNK, D=p["D"],
                                dt_bias=p["dt_bias"], initial_states=init, dt_softplus=True, dt_limit=LIMIT,
                                return_final_states=True)


def _hf_step(x, dt, Bm, Cm, p, state):
    """The mixer's cached step: dt, A, D, dt_bias expanded per channel as NemotronHMamba2Mixer expands them."""
    A = -torch.exp(p["a_log"])
    return TM.mamba2_selective_state_update(state, x, dt[..., None].expand(-1, -1, P),
                                            A[:, None, None].expand(-1, P, N), Bm, Cm, p["D"][:, None].expand(-1, P),
                                            z=None, dt_bias=p["dt_bias"][:, None].expand(-1, P), dt_softplus=True)


@pytest.mark.parametrize("fn", [M.ssd_prefill, M.ssd_reference], ids=["triton", "reference"])
@pytest.mark.parametrize("has_state", [False, True], ids=["zeros", "from_state"])
def test_prefill_then_decode_equal_transformers(inputs, fn, has_state):
    p, r, slots = inputs, inputs["r"], inputs["slots"]
    T = 37                                                       # 2 full chunks of 16 and a partial one
    x, dt, Bm, Cm = r(B, T, H, P), r(B, T, H), r(B, T, G, N), r(B, T, G, N)
    ours, theirs = p["state"].clone(), p["state"][slots].clone()
    y = fn(x, dt, Bm, Cm, p["a_log"], p["dt_bias"], p["D"], ours, slots, chunk=CHUNK, has_state=has_state,
           dt_limit=LIMIT)
    y_hf, final = _hf_prefill(x, dt, Bm, Cm, p, theirs if has_state else None)
    close(y, y_hf)
    close(ours[slots], final)
    assert torch.equal(ours[1], p["state"][1])                  # a slot the call does not name stays as it was
    step = M.ssd_decode if fn is M.ssd_prefill else M.step_reference
    theirs = final.clone()
    for _ in range(3):                                           # decode continues from the prefill's state
        x1, dt1, B1, C1 = r(B, H, P), r(B, H), r(B, G, N), r(B, G, N)
        y1 = step(x1, dt1, B1, C1, p["a_log"], p["dt_bias"], p["D"], ours, slots)
        close(y1, _hf_step(x1, dt1, B1, C1, p, theirs))
        close(ours[slots], theirs)


def test_prefill_states_differ_when_a_parameter_is_one_percent_off(inputs):
    """The comparison can fail: dt_bias, A_log or D 1% off moves the output or the state past the tolerance."""
    p, r, slots = inputs, inputs["r"], inputs["slots"]
    x, dt, Bm, Cm = r(B, 21, H, P), r(B, 21, H), r(B, 21, G, N), r(B, 21, G, N)
    s = p["state"].clone()
    y = M.ssd_prefill(x, dt, Bm, Cm, p["a_log"], p["dt_bias"], p["D"], s, slots, chunk=CHUNK, has_state=True)
    for key in ("a_log", "dt_bias", "D"):
        q = dict(p, **{key: p[key] * 1.01})
        s2 = p["state"].clone()
        y2 = M.ssd_reference(x, dt, Bm, Cm, q["a_log"], q["dt_bias"], q["D"], s2, slots, chunk=CHUNK, has_state=True)
        with pytest.raises(AssertionError):
            close(y, y2)


def test_conv1d_prefill_and_update_equal_transformers(inputs):
    r, slots = inputs["r"], inputs["slots"]
    C, K = 24, 4
    w, bias = r(C, K), r(C)
    state = torch.zeros(3, C, K - 1)
    x = r(B, 19, C)
    y = CV.causal_conv1d(x, w, bias, state, slots)
    close(y, TM.causal_conv1d_fn(x.transpose(1, 2), w, bias, activation="silu").transpose(1, 2))
    close(CV.reference(x, w, bias, torch.zeros(3, C, K - 1), slots), y)
    assert torch.equal(state[slots], x[:, -(K - 1):].transpose(1, 2))       # the last K - 1 inputs
    hf = torch.cat([torch.zeros(B, C, 1), state[slots]], -1)                 # transformers keeps K columns
    for _ in range(2):
        x1 = r(B, 1, C)
        y1 = CV.causal_conv1d(x1, w, bias, state, slots)
        close(y1, TM.causal_conv1d_update(x1.transpose(1, 2), hf, w, bias, activation="silu").transpose(1, 2))
        close(state[slots], hf[:, :, 1:])
    x2 = r(B, 2, C)                                              # fewer tokens than K - 1, no bias, no SiLU
    ref_state = state.clone()
    y2 = CV.causal_conv1d(x2, w, None, state, slots, silu=False)
    close(y2, CV.reference(x2, w, None, ref_state, slots, silu=False))
    close(state, ref_state)


def test_gated_group_norm_equals_transformers(inputs):
    r = inputs["r"]
    x, z, w = r(5, 32), r(5, 32), r(32)
    hf = TM.NemotronHRMSNormGated(32, group_size=16, eps=1e-5)
    hf.weight.data.copy_(w)
    with torch.no_grad():
        want = hf(x, z)
    close(M.gated_group_rmsnorm(x, z, w, 2, 1e-5), want)
    close(M.gated_norm_reference(x, z, w, 2, 1e-5), want)
    with pytest.raises(AssertionError):                          # one group is not two
        close(M.gated_group_rmsnorm(x, z, w, 1, 1e-5), want)


def test_refusals_name_what_is_allowed(inputs):
    p, r, slots = inputs, inputs["r"], inputs["slots"]
    x, dt, Bm = r(B, 5, H, P), r(B, 5, H), r(B, 5, G, N)
    with pytest.raises(ValueError, match="power of two of at least 16"):
        M.ssd_prefill(x, dt, Bm, Bm, p["a_log"], p["dt_bias"], p["D"], p["state"], slots, chunk=24)
    with pytest.raises(ValueError, match="multiple of B and C's groups"):
        M.ssd_prefill(x, dt, r(B, 5, 3, N), r(B, 5, 3, N), p["a_log"], p["dt_bias"], p["D"], p["state"], slots,
                      chunk=16)
    with pytest.raises(ValueError, match="2 to 9 taps"):
        CV.causal_conv1d(r(B, 3, 8), r(8, 12), None, torch.zeros(3, 8, 11), slots)
    with pytest.raises(ValueError, match="must divide its width"):
        M.gated_group_rmsnorm(r(2, 30), r(2, 30), r(30), 4)


def test_costs_are_the_formulas():
    from roofline import formulas as F

    assert M.prefill_cost(2, 37, H, P, N, G, "fp32", chunk=CHUNK) == F.ssd_prefill(2, 37, H, P, N, G, chunk=CHUNK,
                                                                                    act_dtype="fp32")
    assert M.decode_cost(2, H, P, N, G, torch.bfloat16) == F.ssd_decode(2, H, P, N, G, act_dtype="bf16")
    assert CV.cost(37, 2, 24, 4, "bf16", bias=True) == F.causal_conv1d(37, 2, 24, 4, act_dtype="bf16", bias=True)


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_the_ssd_scan_runner_runs_the_same_scan_on_both_backends(phase):
    """The registered runner (profile's op) on a toy Nemotron-H point: the Triton scan and transformers' torch path
    on the same seeded inputs and layer weights agree (prefill: 40 tokens over chunks of 32)."""
    from roofline.layer import model_ops
    from kernels.backend import get_ops
    from kernels.runner_context import build_context
    from kernels.runner_registry import builder
    import kernels.runners  # noqa: F401  (registers the runners)
    from test_mamba import HYB

    spec = next(o for o in model_ops(HYB) if o.kind == "ssd_scan")
    outs, confs = [], []
    for backend in ("triton", "torch"):
        ctx = build_context(HYB, phase, 2, 40, K=get_ops(backend), dt=torch.float32, dev=torch.device("cpu"), seed=0,
                            tp=None, prec=None, kvdt="fp32")
        fn, conf = builder("ssd_scan")(ctx, spec)
        outs.append(fn())
        confs.append(conf)
    assert outs[0].shape == ((2, 40, 4, 8) if phase == "prefill" else (2, 4, 8))
    close(outs[0], outs[1])
    assert confs[1] == {} and confs[0]["block_n"] == 16 and confs[0].get("chunk", 32) == 32


def test_roofline_check_rows_pass_and_fail_when_dt_a_or_d_is_one_percent_off():
    from kernels import check  # noqa: F401  (gathers the registered groups)
    from kernels import check_mamba as CM
    from kernels.backend import get_ops
    from kernels.check_result import rel_err
    from kernels.runner_registry import CHECKS

    dev, ops = torch.device("cpu"), get_ops("triton")
    rows = CHECKS["mamba"].rows(ops, torch.float32, dev, True, None)
    assert len(rows) == 13 and all(r.passed for r in rows), [str(r) for r in rows if not r.passed]
    assert CHECKS["mamba"].kinds == ("conv1d", "ssd_scan", "gated_norm")
    for kw in (dict(dt_error=0.01), dict(a_error=0.01), dict(d_error=0.01)):
        errs = {n: rel_err(o, r) for n, o, r, _ in CM.mamba_rows(ops, torch.float32, dev, **kw)}
        outs = [e for n, e in errs.items() if n.startswith(("ssd_scan prefill", "ssd_scan decode step"))]
        assert len(outs) == 4 and min(outs) > 10 * CM.TOL["fp32"], (kw, outs)


def _mixer_step(K, m, h, conv_state, state, slots, has_state, limit):
    """NemotronHMamba2Mixer.forward composed from our ops (backend ``K``): in_proj, the conv1d over x, B, C with its
    state, the SSD scan (chunked prefill, or the decode step for one token after a state), the grouped gated norm,
    out_proj."""
    Bsz, T, _ = h.shape
    inner, groups, n, heads = m.intermediate_size, m.n_groups, m.ssm_state_size, m.num_heads
    proj = torch.nn.functional.linear(h, m.in_proj.weight)
    z, xbc, dt = proj.split([inner, m.conv_dim, heads], dim=-1)
    xbc = K.conv1d(xbc, m.conv1d.weight.squeeze(1).contiguous(), m.conv1d.bias, conv_state, slots)
    x, Bm, Cm = xbc.split([inner, groups * n, groups * n], dim=-1)
    p = (m.A_log, m.dt_bias, m.D)
    if T == 1 and has_state:
        y = K.ssd_decode(x[:, 0].view(Bsz, heads, -1), dt[:, 0], Bm[:, 0].view(Bsz, groups, n),
                         Cm[:, 0].view(Bsz, groups, n), *p, state, slots)
    else:
        y = K.ssd_prefill(x.view(Bsz, T, heads, -1), dt, Bm.view(Bsz, T, groups, n), Cm.view(Bsz, T, groups, n), *p,
                          state, slots, chunk=m.chunk_size, has_state=has_state, dt_limit=limit)
    y = K.gated_group_rmsnorm(y.reshape(Bsz * T, inner), z.reshape(Bsz * T, inner), m.norm.weight, groups,
                              m.norm.variance_epsilon)
    return torch.nn.functional.linear(y.view(Bsz, T, inner), m.out_proj.weight)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_the_ops_compose_to_transformers_mixer_forward_prefill_and_decode(backend):
    """transformers' own NemotronHMamba2Mixer.forward (its torch path, with its cache) on a prefill of 21 tokens
    (chunk 16) then 3 decode steps, against our ops composed the same way: outputs, the SSM state and the conv state
    (transformers keeps kernel columns; ours the last kernel - 1) at fp32 1e-4."""
    from transformers import DynamicCache, NemotronHConfig

    from kernels.backend import get_ops

    torch.manual_seed(5)
    cfg = NemotronHConfig(hidden_size=32, mamba_num_heads=4, mamba_head_dim=8, ssm_state_size=16, n_groups=2,
                          conv_kernel=4, chunk_size=16, num_hidden_layers=1, layers_block_type=["mamba"],
                          vocab_size=64, use_conv_bias=True)
    m = TM.NemotronHMamba2Mixer(cfg, layer_idx=0).eval()
    with torch.no_grad():
        m.A_log.add_(torch.randn(4) * 0.3)
        m.dt_bias.copy_(torch.randn(4) * 0.5)
        m.D.copy_(torch.randn(4))
        m.norm.weight.copy_(1 + torch.randn(32) * 0.1)
    K, cache = get_ops(backend), DynamicCache(config=cfg)
    conv_state, state = torch.zeros(2, m.conv_dim, 3), torch.zeros(2, 4, 8, 16)
    slots, limit = torch.arange(2), m.time_step_limit
    with torch.no_grad():
        for step, T in enumerate((21, 1, 1, 1)):
            h = torch.randn(2, T, 32)
            want = m(h, cache=cache)
            got = _mixer_step(K, m, h, conv_state, state, slots, step > 0, limit)
            close(got, want)
            close(state, cache.get_recurrent_state(0, state_idx=0))
            close(conv_state, cache.get_conv_state(0, state_idx=0)[:, :, 1:])
