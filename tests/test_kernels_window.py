"""Issue 20's kernels: sliding-window and softcapped attention (Triton and torch, prefill and decode).

fp32 inputs against the float64 references; shapes that are not multiples of the blocks, windows smaller
than a tile and spanning several, outputs poisoned with NaN, and K/V rows outside every window poisoned
with NaN (a kernel that visits a tile it should skip returns NaN).
"""

import math

import pytest
import torch

import kernels  # noqa: F401  (sets TRITON_INTERPRET before triton loads)
from kernels import decode_attention as DA
from kernels import prefill_attention as PA
from kernels.backend import get_ops
from kernels.check_result import rel_err
from roofline import formulas as F

TOL = 1e-5


def rnd(g, *shape):
    return torch.randn(*shape, generator=g)


def nan(*shape):
    return torch.full(shape, float("nan"))


def _ref_prefill(q, kc, vc, slots, p, **kw):
    return PA.reference(q.double(), kc.double(), vc.double(), slots, p, **kw)


# (B, n, cached, Hq, Hkv, D, window, softcap, blocks)
PREFILL = [
    (2, 37, 0, 4, 2, 16, 5, None, dict(block_m=16, block_n=16)),       # window smaller than a tile
    (1, 70, 0, 2, 1, 24, 40, None, dict(block_m=16, block_n=16)),      # window over several tiles, D not 16k
    (2, 23, 29, 4, 2, 16, 20, None, dict(block_m=16, block_n=16)),     # prefix longer than the window
    (1, 30, 10, 4, 4, 16, 25, None, dict(block_m=32, block_n=16)),     # window fills inside the chunk
    (2, 19, 5, 4, 2, 16, None, 3.0, dict(block_m=16, block_n=16)),     # softcap alone
    (1, 41, 13, 4, 1, 16, 9, 2.5, dict(block_m=16, block_n=16)),       # window and softcap
    (1, 33, 0, 2, 2, 16, 64, None, dict(block_m=16, block_n=16)),      # window longer than the sequence
]


@pytest.mark.parametrize("B,n,p,Hq,Hkv,D,W,cap,cfg", PREFILL)
def test_prefill_window_softcap_matches_reference(B, n, p, Hq, Hkv, D, W, cap, cfg):
    g = torch.Generator().manual_seed(n * 7 + p)
    kc, vc, q = rnd(g, 3, Hkv, 80, D) * 2, rnd(g, 3, Hkv, 80, D), rnd(g, B, n, Hq, D) * 2
    slots = torch.tensor([2, 0][:B])
    o = PA.prefill_attention(q, kc, vc, slots, p, window=W, softcap=cap, out=nan(B, n, Hq, D), **cfg)
    ref = _ref_prefill(q, kc, vc, slots, p, window=W, softcap=cap)
    assert o.shape == (B, n, Hq, D)
    assert rel_err(o, ref) < TOL
    if W is not None and W < p + n:                                   # the window changes the answer
        assert rel_err(_ref_prefill(q, kc, vc, slots, p, softcap=cap), ref) > 1e-2
    if cap is not None:                                               # so does the cap
        assert rel_err(_ref_prefill(q, kc, vc, slots, p, window=W), ref) > 1e-2
    torch_o = get_ops("torch").prefill_attention(q, kc, vc, slots, p, window=W, softcap=cap)
    assert rel_err(torch_o, ref) < TOL


def test_prefill_skips_tiles_outside_the_window():
    # queries at 100..115 (one 16-row tile), W = 8: the first key any of them sees is 93, in the tile
    # [80, 96); K and V rows 0..79 are NaN, so visiting any tile below 80 would poison the output
    g = torch.Generator().manual_seed(3)
    kc, vc, q = rnd(g, 1, 2, 128, 16), rnd(g, 1, 2, 128, 16), rnd(g, 1, 16, 4, 16)
    ref = _ref_prefill(q, kc, vc, torch.tensor([0]), 100, window=8)
    kc[:, :, :80], vc[:, :, :80] = float("nan"), float("nan")
    o = PA.prefill_attention(q, kc, vc, torch.tensor([0]), 100, window=8, block_m=16, block_n=16)
    assert rel_err(o, ref) < TOL
    kc[:, :, :93], vc[:, :, :93] = float("nan"), float("nan")       # the torch peer reads from 100 - 8 + 1
    assert rel_err(get_ops("torch").prefill_attention(q, kc, vc, torch.tensor([0]), 100, window=8), ref) < TOL


def test_chunked_prefill_with_a_window_equals_one_prefill():
    g = torch.Generator().manual_seed(5)
    S, W = 50, 12
    kc, vc, q = rnd(g, 1, 2, 64, 16), rnd(g, 1, 2, 64, 16), rnd(g, 1, S, 4, 16)
    slots = torch.tensor([0])
    whole = PA.prefill_attention(q, kc, vc, slots, 0, window=W, block_m=16, block_n=16)
    parts = [PA.prefill_attention(q[:, a:b], kc, vc, slots, a, window=W, block_m=16, block_n=16)
             for a, b in ((0, 7), (7, 30), (30, S))]
    assert rel_err(torch.cat(parts, 1), whole) < TOL
    assert rel_err(whole, _ref_prefill(q, kc, vc, slots, 0, window=W)) < TOL


# (lengths, Hq, Hkv, D, window, softcap, config)
DECODE = [
    ([3, 40, 0, 17], 4, 2, 16, 16, None, dict(block_n=16, splits=3)),   # lengths on both sides of W
    ([50, 13], 8, 1, 24, 7, None, dict(block_n=16)),                    # window smaller than a tile
    ([61, 33, 1], 4, 4, 16, 40, None, dict(block_n=16, splits=2)),      # window over several tiles
    ([37, 5], 4, 2, 16, None, 4.0, dict(block_n=16, splits=3)),         # softcap alone
    ([45, 9], 4, 2, 16, 20, 2.0, dict(block_n=16)),                     # window and softcap
]


@pytest.mark.parametrize("lens,Hq,Hkv,D,W,cap,cfg", DECODE)
def test_decode_window_softcap_matches_reference(lens, Hq, Hkv, D, W, cap, cfg):
    g = torch.Generator().manual_seed(len(lens) * 11 + Hq)
    B = len(lens)
    kc, vc, q = rnd(g, 4, Hkv, 64, D) * 2, rnd(g, 4, Hkv, 64, D), rnd(g, B, Hq, D) * 2
    slots, ln = torch.tensor([3, 0, 1, 2][:B]), torch.tensor(lens)
    o = DA.decode_attention(q, kc, vc, ln, slots, window=W, softcap=cap, out=nan(B, Hq, D), **cfg)
    ref = DA.reference(q.double(), kc.double(), vc.double(), ln, slots, window=W, softcap=cap)
    assert o.shape == (B, Hq, D)
    assert rel_err(o, ref) < TOL
    assert rel_err(get_ops("torch").decode_attention(q, kc, vc, ln, slots, window=W, softcap=cap), ref) < TOL
    if W is not None and max(lens) > W:
        assert rel_err(DA.reference(q.double(), kc.double(), vc.double(), ln, slots, softcap=cap), ref) > 1e-2
    if cap is not None:
        assert rel_err(DA.reference(q.double(), kc.double(), vc.double(), ln, slots, window=W), ref) > 1e-2
    if 0 in lens:
        assert torch.equal(o[lens.index(0)], torch.zeros(Hq, D))


def test_decode_reads_only_the_window():
    # len 50, W = 13: keys 37..49; rows 0..36 NaN for both peers (the Triton splits start at 37 exactly)
    g = torch.Generator().manual_seed(9)
    kc, vc, q = rnd(g, 2, 2, 64, 16), rnd(g, 2, 2, 64, 16), rnd(g, 2, 4, 16)
    ln, slots = torch.tensor([50, 44]), torch.tensor([1, 0])
    ref = DA.reference(q.double(), kc.double(), vc.double(), ln, slots, window=13)
    kc[1, :, :37], vc[1, :, :37] = float("nan"), float("nan")
    kc[0, :, :31], vc[0, :, :31] = float("nan"), float("nan")
    assert rel_err(DA.decode_attention(q, kc, vc, ln, slots, window=13, block_n=16, splits=2), ref) < TOL
    assert rel_err(get_ops("torch").decode_attention(q, kc, vc, ln, slots, window=13), ref) < TOL


def test_decode_splits_cover_the_window_not_the_context():
    # 1 sequence of 4,096 keys with a 64-key window and 64-key tiles: one split of one tile
    c = DA.decode_config(1, 8, min(4096, 64), "cpu", block_n=64)
    assert (c["splits"], c["split_size"]) == (1, 64)


def test_sm_scale_reaches_both_backends():
    g = torch.Generator().manual_seed(2)
    kc, vc = rnd(g, 1, 2, 32, 16), rnd(g, 1, 2, 32, 16)
    q, qd = rnd(g, 1, 20, 4, 16), rnd(g, 1, 4, 16)
    s0, ln = torch.tensor([0]), torch.tensor([20])
    ref = _ref_prefill(q, kc, vc, s0, 0, sm_scale=0.5, window=6)
    refd = DA.reference(qd.double(), kc.double(), vc.double(), ln, s0, sm_scale=0.5, window=6)
    assert rel_err(_ref_prefill(q, kc, vc, s0, 0, window=6), ref) > 1e-2          # 0.5 is not 1/sqrt(16)
    for ops in (get_ops("triton"), get_ops("torch")):
        assert rel_err(ops.prefill_attention(q, kc, vc, s0, 0, sm_scale=0.5, window=6), ref) < TOL
        assert rel_err(ops.decode_attention(qd, kc, vc, ln, s0, sm_scale=0.5, window=6), refd) < TOL


@pytest.mark.parametrize("kw,msg", [(dict(window=0), "window must be"), (dict(window=2.5), "window must be"),
                                    (dict(softcap=0.0), "softcap must be"),
                                    (dict(window=4, causal=False), "causal")])
def test_bad_window_or_softcap_is_one_line(kw, msg):
    q, kc = torch.zeros(1, 4, 2, 16), torch.zeros(1, 2, 8, 16)
    for fn in (PA.prefill_attention, get_ops("torch").prefill_attention):
        with pytest.raises(ValueError, match=msg) as e:
            fn(q, kc, kc, torch.tensor([0]), 0, **kw)
        assert "\n" not in str(e.value)


def test_attention_costs_take_the_window():
    assert PA.cost(2, 64, 8, 2, 64, window=32, dtype="bf16") == F.prefill_attention(2, 64, 8, 2, 64, window=32)
    assert PA.cost(2, 64, 8, 2, 64, window=32).flops == 4 * 2 * 8 * 64 * 1536
    c = DA.cost(1, 16384, 32, 8, 128, window=4096)
    assert c == F.decode_attention(1, 16384, 32, 8, 128, window=4096)
    assert c.flops == 4 * 32 * 4096 * 128
    assert math.isclose(DA.cost(1, 16384, 32, 8, 128).flops / c.flops, 4.0)


# ---------------------------------------------------------------- GeGLU

@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.float16, 2e-3), (torch.bfloat16, 1.6e-2)])
def test_geglu_matches_gelu_tanh_times_up(dtype, tol):
    from kernels import geglu as G

    g = torch.Generator().manual_seed(4)
    gate = (rnd(g, 3, 1500) * 4).to(dtype)                            # far into both tails of the tanh
    gate[0, :3] = torch.tensor([0.0, 30.0, -30.0])
    up = rnd(g, 3, 1500).to(dtype)
    ref = torch.nn.functional.gelu(gate.double(), approximate="tanh") * up.double()
    y = G.geglu(gate, up, out=torch.full((3, 1500), float("nan"), dtype=dtype))
    assert y.dtype == dtype and y.shape == (3, 1500)
    assert rel_err(y, ref) < tol
    assert rel_err(G.reference(gate, up), ref) < tol
    assert rel_err(get_ops("torch").geglu(gate, up), ref) < tol
    # not swiglu: silu differs from gelu-tanh by far more than the tolerance
    assert rel_err(torch.nn.functional.silu(gate.double()) * up.double(), ref) > 1e-2


def test_geglu_cost_and_errors():
    from kernels import geglu as G

    assert G.cost(2, 10) == F.geglu(2, 10) and G.cost(2, 10).flops == 180
    with pytest.raises(ValueError, match="up must have shape"):
        G.geglu(torch.zeros(3, 4), torch.zeros(3, 5))


# ---------------------------------------------------------------- linear with a bias

LIN = [(37, 70, 90, dict(block_m=16, block_n=32, block_k=16)),       # tiles, no split
       (3, 200, 300, dict(block_k=32, split_k=3)),                  # split-K: the bias added once
       (1, 48, 40, {})]


@pytest.mark.parametrize("M,N,K,cfg", LIN)
def test_linear_bias_fused_in_the_epilogue(M, N, K, cfg):
    from kernels import linear as L

    g = torch.Generator().manual_seed(M + N)
    x, w, b = rnd(g, M, K), rnd(g, K, N), rnd(g, N) * 10               # a large bias: added twice shows
    ref = x.double() @ w.double() + b.double()
    y = get_ops("triton").linear(x, w, b, out=nan(M, N), **cfg)
    assert y.shape == (M, N) and rel_err(y, ref) < TOL
    assert rel_err(get_ops("torch").linear(x, w, b), ref) < TOL
    assert rel_err(L.reference(x.double(), w.double(), b.double()), ref) < 1e-12
    assert rel_err(get_ops("triton").linear(x, w, **cfg), x.double() @ w.double()) < TOL   # without: unchanged
    x3 = x[None]                                                                             # [1, M, K] rows
    assert get_ops("torch").linear(x3, w, b).shape == (1, M, N)


@pytest.mark.parametrize("kind,qkw", [("int8", {}), ("int4", dict(group_size=32)),
                                      ("int4", dict(group_size=32, zero_point=True))])
def test_quantized_linear_bias(kind, qkw):
    from kernels import linear_int4 as L4
    from kernels import linear_int8 as L8
    from kernels.quant import quantize_weight

    g = torch.Generator().manual_seed(7)
    for M, N, K, cfg in [(37, 70, 128, dict(block_m=16, block_n=32, block_k=32)), (3, 200, 256,
                                                                                     dict(block_k=32, split_k=3))]:
        x, w, b = rnd(g, M, K), rnd(g, K, N), rnd(g, N) * 10
        qw = quantize_weight(w, kind, **qkw)
        ref = (L8 if kind == "int8" else L4).reference(x.double(), qw, b.double())
        assert rel_err(ref, (L8 if kind == "int8" else L4).reference(x.double(), qw) + b.double()) < 1e-12
        y = get_ops("triton").linear(x, qw, b, out=nan(M, N), **cfg)
        assert rel_err(y, ref) < TOL
        assert rel_err(get_ops("torch").linear(x, qw, b), ref) < 1e-4


def test_linear_bias_errors_and_cost():
    from kernels import linear as L

    x, w = torch.zeros(3, 8), torch.zeros(8, 5)
    with pytest.raises(ValueError, match=r"bias must have shape \[5\]"):
        L.linear(x, w, torch.zeros(4))
    with pytest.raises(ValueError, match="bias must have dtype"):
        L.linear(x, w, torch.zeros(5, dtype=torch.float16))
    assert L.cost(3, 8, 5, bias=True) == F.linear(3, 8, 5, bias=True)
    assert L.cost(3, 8, 5, bias=True).flops - L.cost(3, 8, 5).flops == 15


# ---------------------------------------------------------------- checks and compile-check variants

def test_run_checks_cover_the_new_features():
    from kernels.check import run_checks

    res = [r for r in run_checks("triton", "fp32", parts=("kernels",))
           if r.name.startswith(("linear+bias", "geglu")) or " window=" in r.name or " softcap=" in r.name]
    names = " | ".join(r.name for r in res)
    assert len(res) == 12, names                                   # the verify step's window row included
    assert "linear+bias M=3" in names and "geglu" in names and "p=29 window=20" in names
    assert "verify_attn T=4 lens=[45, 9] Hq/Hkv=4/2 D=16 window=10 softcap=5.0" in names
    assert "decode_attn lens=[3, 40, 0, 17] window=16" in names and "softcap=2.5" in names
    assert all(r.passed for r in res), [str(r) for r in res if not r.passed]


def test_variants_launch_window_softcap_bias_and_geglu():
    from kernels import compile_launches as CL, variants as V
    from kernels._launch import kernel_name, recording
    from roofline.models import load_model

    cfg = load_model("llama-3-8b")
    flags = {}
    with recording(132) as rec:
        for phase in ("prefill", "decode"):
            CL.architecture_launches(rec, {}, cfg, phase, 2, 128, torch.bfloat16, V.TARGETS["sm_90"])
    win_arg = {"_prefill_attn_kernel": 15, "_decode_split_kernel": 13}     # Llama-4's chunk, in the window's place
    chunked = {(kernel_name(ln.kernel), ln.args[win_arg[kernel_name(ln.kernel)]]) for ln in rec.launches
               if ln.constexprs.get("CHUNK")}
    assert chunked == {("_prefill_attn_kernel", CL.CHUNK), ("_decode_split_kernel", CL.CHUNK)}
    for ln in rec.launches:
        c = ln.constexprs
        if c.get("CHUNK"):
            continue
        flags.setdefault(kernel_name(ln.kernel), set()).add(
            tuple(c.get(k) for k in ("WINDOW", "SOFTCAP", "BIAS") if k in c))
    assert flags["_prefill_attn_kernel"] == flags["_decode_split_kernel"] == {(True, False), (True, True),
                                                                               (False, True)}
    assert flags["_linear_kernel"] == flags["_linear_int8_kernel"] == flags["_linear_int4_kernel"] == {(True,)}
    assert "_geglu_kernel" in flags
    # the window reaches the decode kernel as a runtime int and the splits cover min(129, 4096) keys
    dec = [ln for ln in rec.launches if kernel_name(ln.kernel) == "_decode_split_kernel"
           and not ln.constexprs.get("CHUNK")]
    assert {ln.args[13] for ln in dec} == {4096, 0}
