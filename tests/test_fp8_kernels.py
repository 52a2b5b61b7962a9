"""FP8 kernels (issue 29): the W8A8 GEMM (kernels.linear_fp8), the activation quantization (kernels.act_quant), fp8
KV caches in the attention kernels, their `roofline check` rows (kernels.check_fp8) and compile-check variants.

On this CPU the Triton kernels run under the interpreter (TRITON_INTERPRET=1): e4m3 loads upcast to fp32 exactly
and fp32 dots of e4m3 values are exact per product, so the kernels themselves are tested against the references.

Run: pytest tests/test_fp8_kernels.py
"""

import textwrap

import pytest
import torch

from kernels import act_quant as AQ
from kernels import check_fp8 as CF
from kernels import compile_launches as CL
from kernels import decode_attention as DA
from kernels import linear_fp8 as LF
from kernels import moe as MOE
from kernels import prefill_attention as PA
from kernels._common import INTERPRET
from kernels._launch import recording
from kernels.backend import get_ops
from kernels.quant import quantize_experts, quantize_kv_rows, torch_linear
from kernels.quant_weight import FORMATS as QFORMATS
from kernels.runner_registry import MetaCombo
from roofline.errors import RooflineError
from roofline.models import load_model

CPU = torch.device("cpu")
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------- activation quantization

@pytest.mark.parametrize("fmt,group", [("fp8", 0), ("fp8-group", 128)])
def test_act_quant_kernel_is_bit_exact_with_its_reference(fmt, group):
    g = gen(1)
    for M, K in ((5, 300), (17, 1000), (1, 37), (3, 128)):
        for dt in DTYPES:
            x = (torch.randn(M, K, generator=g) * 3).to(dt)
            x[0, :130] = 0                                       # a zero group: scale 0, values 0
            q, s = AQ.act_quant(x, fmt)
            qr, sr = AQ.reference(x, fmt)
            assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32
            assert tuple(s.shape) == ((M, -(-K // 128)) if group else (M,))
            assert torch.equal(q.view(torch.uint8), qr.view(torch.uint8)), (M, K, dt)
            assert torch.equal(s, sr)
            # the reference within the e4m3 bound of x: |x - q s| <= 2^-4 |x| + 2^-10 s (+ fp32 arithmetic)
            assert CF.act_quant_err(x, qr, sr, group) <= 1.0


def test_e4m3_rounding_carries_into_the_next_binade():
    # 31.66 rounds to 32 (a mantissa carry); the interpreter's own fp32 -> e4m3 cast gives 16 (why e4m3_round exists)
    x = torch.tensor([[31.66, -7.79, 1.97, 447.9, 0.0123, -0.0009, 448.0, 0.0]], dtype=torch.float32)
    q, s = AQ.act_quant(x, "fp8")
    qr, sr = AQ.reference(x, "fp8")
    assert torch.equal(q.view(torch.uint8), qr.view(torch.uint8)) and torch.equal(s, sr)
    assert float(s[0]) == 1.0                                    # amax 448: scale 448 / 448


def test_act_quant_cost_counts_the_registry_bytes():
    # 16 tokens x 4096: read 16*4096*2 = 131,072 (bf16); write 65,536 e4m3 + scales
    assert AQ.cost(16, 4096, "bf16", "fp8").bytes == 131_072 + 65_536 + 16 * 4            # 196,672
    assert AQ.cost(16, 4096, "bf16", "fp8-group").bytes == 131_072 + 65_536 + 16 * 32 * 4  # 198,656
    assert AQ.cost(16, 4096, "bf16", "fp8").flops == 0


# ---------------------------------------------------------------- the GEMM

CASES = ((37, 70, 300, dict(block_m=16, block_n=32, block_k=32)), (3, 200, 260, dict(split_k=3)), (1, 48, 64, {}),
         (70, 130, 257, dict(block_m=64, block_n=64, block_k=128)))


@pytest.mark.parametrize("fmt", LF.FORMATS)
def test_the_fp8_gemm_kernel_matches_the_fp64_reference(fmt):
    assert INTERPRET, "this CPU runs the Triton kernel under the interpreter"
    g = gen(2)
    for M, N, K, cfg in CASES:
        qw = LF.quantize(torch.randn(K, N, generator=g) * K ** -0.5, fmt)
        x = torch.randn(M, K, generator=g)
        b = torch.randn(N, generator=g) * 0.1
        xq, xs = AQ.act_quant(x, LF.act_format_for(qw))
        ref = LF.reference_q(xq, xs, qw, b)
        y = LF.gemm_fp8(xq, xs, qw, b, out_dtype=torch.float32, **cfg)
        # fp32 out: the kernel's only error is fp32 summation order (products of e4m3 values are exact): 1e-5
        assert float((y.double() - ref).abs().max() / ref.abs().max()) < 1e-5, (M, N, K, cfg)
        for dt, tol in ((torch.bfloat16, 2 ** -7), (torch.float16, 2 ** -10)):
            yb = LF.linear_fp8(x.to(dt), qw, b.to(dt), **cfg)
            xq, xs = AQ.reference(x.to(dt), LF.act_format_for(qw))
            rb = LF.reference_q(xq, xs, qw, b.to(dt))
            assert yb.dtype == dt and yb.shape == (M, N)
            # one unit in the output's last place (the interpreter truncates) + fp32 accumulation
            assert float(((yb.double() - rb).abs() / (tol * rb.abs() + 1e-6)).max()) <= 1.0, (dt, M, N, K)


def test_the_torch_path_is_scaled_mm_row_wise_or_a_labelled_dequantize_reference():
    g = gen(3)
    for fmt in LF.FORMATS:
        qw = LF.quantize(torch.randn(300, 70, generator=g) * 0.05, fmt)
        x = torch.randn(5, 300, generator=g).to(torch.bfloat16)
        b = (torch.randn(70, generator=g) * 0.1).to(torch.bfloat16)
        y = torch_linear(x, qw, b)                       # through the QuantWeight format registry
        assert QFORMATS[fmt].torch_linear is LF.torch_linear
        xq, xs = AQ.reference(x, LF.act_format_for(qw))
        ref = LF.reference_q(xq, xs, qw, b)
        # bf16 out: one unit (2^-7) + fp32 accumulation (300 x 2^-24 x sum |x w|, below 1e-6 of |ref| here)
        assert float(((y.double() - ref).abs() / (2 ** -7 * ref.abs() + 1e-6)).max()) <= 1.0
        if fmt == "fp8-block":                           # torch._scaled_mm has no 128x128 blocks on the CPU
            assert qw.torch_impl.startswith("dequantize reference: fp8 x and w dequantized to fp32")
        else:                                            # torch 2.13 runs it on the CPU
            assert qw.torch_impl == "torch._scaled_mm (row-wise scales)"


def test_quantize_layouts_and_round_trip():
    w = torch.randn(300, 70, generator=gen(4))
    shapes = {"fp8": (70,), "fp8-tensor": (1,), "fp8-block": (1, 3)}       # 70 / 128 -> 1, 300 / 128 -> 3
    for fmt in LF.FORMATS:
        qw = LF.quantize(w, fmt)
        assert qw.qweight.shape == (70, 300) and qw.qweight.dtype == torch.float8_e4m3fn
        assert tuple(qw.scales.shape) == shapes[fmt] and qw.scales.dtype == torch.float32
        dq = qw.dequantize(torch.float64)                 # QuantWeight's registry dispatch
        step = LF.scales_per_element(qw.scales.double(), LF.fp8_format(fmt), 300, 70).t()
        assert bool(((dq - w.double()).abs() <= 2 ** -4 * w.double().abs() + 2 ** -10 * step + 1e-12).all())
    assert LF.act_format_for("fp8").name == "fp8" and LF.act_format_for("fp8-tensor").name == "fp8"
    assert LF.act_format_for("fp8-block").name == "fp8-group"
    with pytest.raises(ValueError, match="block_k must be at least 32"):
        LF.linear_fp8_config(8, 64, 256, block=True, block_k=16)
    with pytest.raises(ValueError, match="an fp8 W8A8 GEMM takes weights in fp8, fp8-tensor, fp8-block"):
        LF.fp8_format("mxfp8")


def test_gemm_cost_exact_integers():
    T, K, N = 16, 4096, 4096
    flops = 2 * T * K * N                                                    # 536,870,912
    act_tok, act_grp, out = T * K + T * 4, T * K + T * 32 * 4, T * N * 2     # 65,600; 67,584; 131,072
    c = LF.cost(T, K, N, "fp8-block", "bf16")
    assert c.flops == flops == 536_870_912
    assert c.bytes == K * N + 32 * 32 * 4 + act_grp + out == 16_979_968
    assert LF.cost(T, K, N, "fp8", "bf16").bytes == K * N + N * 4 + act_tok + out == 16_990_272
    assert LF.cost(T, K, N, "fp8-tensor", "bf16").bytes == K * N + 4 + act_tok + out == 16_973_892
    cb = LF.cost(T, K, N, "fp8", "fp16", bias=True)
    assert cb.flops == flops + T * N and cb.bytes == 16_990_272 + N * 2


def test_a_gpu_without_fp8_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(LF, "fp8_supported", lambda dev: False)
    with pytest.raises(RooflineError) as e:
        LF.check_fp8_device(torch.device("cuda"))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("fp8 GEMM needs a GPU with fp8 (sm_89+: Ada, Hopper, Blackwell); cuda")
    assert msg.endswith("(under the Triton interpreter it runs on the CPU, the torch path too).")
    monkeypatch.setattr(CF, "fp8_supported", lambda dev: False)
    assert CF.fp8_skip("triton", "cuda") == msg and CF.fp8_skip("torch", "cuda") == ""
    assert CF.fp8_skip("triton", "cpu") == ""                            # the interpreter runs the kernels
    LF.check_fp8_device(CPU)                                              # no refusal on the interpreter's CPU


# ---------------------------------------------------------------- fp8 KV caches

def test_fp8_kv_caches_per_token_and_per_tensor_in_both_attention_kernels():
    g = gen(5)
    (kq, ks), (vq, vs) = (quantize_kv_rows(torch.randn(4, 2, 64, 16, generator=g), "fp8") for _ in range(2))
    kf = torch.randn(4, 2, 64, 16, generator=g)
    st = kf.abs().max().reshape(1) / 448
    kt = (kf / st).to(torch.float8_e4m3fn)
    q, qp = torch.randn(3, 4, 16, generator=g), torch.randn(2, 19, 4, 16, generator=g)
    ln, sl = torch.tensor([37, 1, 60]), torch.tensor([3, 0, 1])
    for k, v, sc in ((kq, vq, (ks, vs)), (kt, kt, (st, st))):
        o = DA.decode_attention(q, k, v, ln, sl, scales=sc, block_n=16)
        r = DA.reference(q.double(), k, v, ln, sl, scales=sc)
        assert float((o.double() - r).abs().max() / r.abs().max()) < 1e-5
        o = PA.prefill_attention(qp, k, v, torch.tensor([2, 0]), 5, scales=sc, block_m=16, block_n=16)
        r = PA.reference(qp.double(), k, v, torch.tensor([2, 0]), 5, scales=sc)
        assert float((o.double() - r).abs().max() / r.abs().max()) < 1e-5
    kind, (ek, ev) = PA.cache_scales(kt, (st, st))
    assert kind == "fp8" and ek.shape == (4, 2, 64) and ek.stride() == (0, 0, 0) and PA.scale_strides(ek) == (0, 0, 0)


# ---------------------------------------------------------------- roofline check rows, and a scale 1% off

def test_the_check_rows_pass_on_both_backends():
    for be in ("torch", "triton"):
        rows = CF.fp8_checks(get_ops(be), torch.bfloat16, CPU)
        assert len(rows) == 46, be        # 3 formats x 3 shapes x 2 outputs, 2 x 3 x 2 act quant, 3 x 2 experts,
        #                                   2 caches x 5
        assert all(r.passed for r in rows), [str(r) for r in rows if not r.passed]
        names = {r.name for r in rows}
        assert "linear_fp8 fp8-block M=37 N=70 K=300 +bias out fp16" in names
        assert "decode_attn fp8-tensor KV lens=[37, 1, 0, 60] Hq=4" in names and "act_quant fp8-group M=5 K=1000 fp32" in names
        assert "moe_experts fp8-block T=40 E=4 k=2 silu" in names


def _off(t: torch.Tensor) -> torch.Tensor:
    """``t`` with its first scale 1% off (a copy)."""
    t = t.clone()
    t.view(-1)[0] *= 1.01
    return t


def _qw_off(qw):
    return LF.QuantWeight(qw.dtype, qw.qweight, _off(qw.scales), None, *qw.shape, qw.group_size)


@pytest.mark.parametrize("be", ["torch", "triton"])
@pytest.mark.parametrize("which", ["activation", "weight"])
def test_every_gemm_row_fails_when_a_scale_is_one_percent_off(monkeypatch, be, which):
    tri = be == "triton"
    name = "gemm_fp8" if tri else "torch_gemm"
    real = getattr(LF, name)

    def off(xq, xs, qw, bias=None, **kw):                # the activations' row 0 or the weight's first scale
        return real(xq, _off(xs), qw, bias, **kw) if which == "activation" else real(xq, xs, _qw_off(qw), bias, **kw)
    monkeypatch.setattr(LF, name, off)
    rows = list(CF.gemm_checks(tri, CPU, gen(8)))
    assert len(rows) == 18 and not any(r.passed for r in rows), [str(r) for r in rows if r.passed]


@pytest.mark.parametrize("be", ["torch", "triton"])
def test_every_act_quant_row_fails_when_a_scale_is_one_percent_off(monkeypatch, be):
    name = "act_quant" if be == "triton" else "reference"
    real = getattr(AQ, name)
    monkeypatch.setattr(AQ, name, lambda x, fmt="fp8", **kw: (lambda q, s: (q, _off(s)))(*real(x, fmt, **kw)))
    rows = list(CF.act_quant_checks(be == "triton", torch.bfloat16, CPU, gen(8)))
    assert len(rows) == 12 and not any(r.passed for r in rows), [str(r) for r in rows if r.passed]


@pytest.mark.parametrize("be", ["torch", "triton"])
def test_every_fp8_kv_row_fails_when_a_scale_is_one_percent_off(monkeypatch, be):
    def v_off(sc):                                      # V's scale of token 0 (every slot and head), or the tensor's
        v = sc[1].clone()
        if v.numel() == 1:
            v *= 1.01
        else:
            v[:, :, 0] *= 1.01
        return sc[0], v
    fns = (("prefill_attention", PA), ("decode_attention", DA)) if be == "triton" else (("sdpa", PA),
                                                                                        ("torch_decode", DA))
    for name, mod in fns:
        real = getattr(mod, name)
        monkeypatch.setattr(mod, name, lambda *a, _real=real, scales=None, **kw: _real(*a, scales=v_off(scales), **kw))
    rows = list(CF.kv_checks(be == "triton", CPU, gen(8)))
    assert len(rows) == 10 and not any(r.passed for r in rows), [str(r) for r in rows if r.passed]


# ---------------------------------------------------------------- compile-check variants

def _recorded(target_cap: int, sms: int, phase: str):
    cfg = load_model("llama-2-7b")
    tgt = type("T", (), dict(capability=target_cap))()
    combo = MetaCombo(dict(model="llama-2-7b", phase=phase, b=8, ctx=128, dtype="bf16"), cfg, phase, 8, 128,
                      torch.bfloat16, tgt)
    with recording(sms) as rec:
        CL._linear(rec, combo)
        CL._attention(rec, combo)
    return [(ln.name, ln.context["op"]) for ln in rec.launches]


def test_compile_variants_fp8_on_sm_90_none_on_sm_80():
    assert CL.FP8_CAPABILITY == 89 and CL.FP8_GEMMS == ("fp8", "fp8-block") and CL.FP8_DTYPES == ("bf16",)
    sm90 = _recorded(90, 132, "decode")
    ops = {op for _, op in sm90}
    assert {"q_proj w=fp8 a=fp8", "q_proj w=fp8-block a=fp8-group", "attention kv=fp8-tensor"} <= ops
    kernels = {n for n, op in sm90 if "fp8" in op}
    assert kernels == {"_act_quant_kernel", "_linear_fp8_kernel", "_decode_split_kernel", "_decode_merge_kernel"}
    assert not any("fp8" in op for _, op in _recorded(80, 108, "decode"))   # sm_80 has no fp8: not launched
    assert {n for n, op in _recorded(90, 132, "prefill") if "fp8" in op} == {"_act_quant_kernel", "_linear_fp8_kernel",
                                                                           "_prefill_attn_kernel"}


# ---------------------------------------------------------------- fp8 routed experts (the fused MoE, W8A16)

def _experts(fmt, E, H, I, dt, g):  # noqa: E741
    return [quantize_experts((torch.randn(E, K, N, generator=g) * K ** -0.5).to(dt), fmt)
            for K, N in ((H, I), (H, I), (I, H))]


@pytest.mark.parametrize("fmt", LF.FORMATS)
@pytest.mark.parametrize("E,H,I", [(2, 128, 256), (4, 256, 128)])
def test_fp8_experts_match_the_reference_on_both_backends(fmt, E, H, I):  # noqa: E741
    """Top-2 over E experts, fp8 per channel / per tensor / 128 x 128 blocks: the fused kernels (e4m3 decoded in
    registers) and the torch peer (x @ the dequantized expert) against the fp64 loop over the dequantized experts:
    fp32 x to 1e-5 (fp32 accumulation), bf16 x to 2^-6 of max |ref| (bf16 h between the launches and bf16 out; the
    torch peer's bf16 weight too). x stays bf16: nothing quantizes it (weight-only)."""
    g = gen(11)
    T, k = 6, 2
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)])
    w = torch.softmax(torch.randn(T, k, generator=g), -1)
    for dt, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2.0 ** -6)):
        q = _experts(fmt, E, H, I, dt, g)
        x = torch.randn(T, H, generator=g).to(dt)
        ref = MOE.reference(x.double(), *q, w.double(), ids, compute_dtype=torch.float64)
        for be in ("triton", "torch"):
            y = get_ops(be).moe_experts(x, *q, w, ids)
            assert y.dtype == dt and y.shape == (T, H)
            err = float((y.double() - ref).abs().max() / ref.abs().max())
            assert err <= tol, (fmt, be, dt, err)
    assert q[0].torch_impl == LF.EXPERT_IMPL and "not quantized" in q[0].torch_impl
    assert not QFORMATS[fmt].acts.get("experts")             # weight-only: the cost's activations stay bf16


def test_fp8_experts_torch_peer_is_the_weight_only_arithmetic_not_the_w8a8_linear():
    """The torch backend's fp8 expert is x @ dequant(W) in x's dtype (what the fused kernel computes), not the fp8
    linear's W8A8 (x quantized to e4m3 first): bit for bit the former, and measurably not the latter."""
    g = gen(12)
    q = _experts("fp8", 2, 128, 128, torch.float32, g)
    x = torch.randn(5, 128, generator=g)
    ids, w = torch.zeros(5, 1, dtype=torch.int64), torch.ones(5, 1)
    got = MOE.torch_moe(x, *q, w, ids)
    e0 = [t.expert(0) for t in q]
    h = torch.nn.functional.silu(x @ e0[0].dequantize()) * (x @ e0[1].dequantize())
    assert torch.equal(got, h @ e0[2].dequantize())
    w8a8 = torch_linear(torch.nn.functional.silu(torch_linear(x, e0[0])) * torch_linear(x, e0[1]), e0[2])
    assert float((got - w8a8).abs().max()) > 1e-4 * float(got.abs().max())


@pytest.mark.parametrize("be", ["torch", "triton"])
def test_every_fp8_expert_row_fails_when_a_scale_is_one_percent_off(monkeypatch, be):
    """Expert 0's scales 1% high in what the kernels read (triton: the scales ``_weight_args`` passes; torch: every
    expert's in its weight-only GEMM); the reference dequantizes the stored ones. Expert 0 takes most tokens."""
    if be == "triton":
        real = MOE._weight_args

        def off(w):
            a = list(real(w))
            if a[5]:
                a[2] = a[2].clone()
                a[2][0] *= 1.01
            return tuple(a)
        monkeypatch.setattr(MOE, "_weight_args", off)
    else:
        for f in LF.FORMATS:
            monkeypatch.setattr(QFORMATS[f], "torch_expert", lambda x, qw: x @ (LF.dequantize(qw, x.dtype) * 1.01))
    rows = list(CF.moe_checks(be == "triton", get_ops(be), CPU, gen(8)))
    assert len(rows) == 6 and not any(r.passed for r in rows), [str(r) for r in rows if r.passed]
    assert all(1e-3 < r.max_rel_err < 1.0 for r in rows), [str(r) for r in rows]


def test_fp8_expert_block_k_must_divide_the_weight_blocks_and_bad_layouts_are_refused():
    g = gen(13)
    q = _experts("fp8-block", 2, 128, 128, torch.float32, g)
    x, ids, w = torch.randn(3, 128, generator=g), torch.zeros(3, 1, dtype=torch.int64), torch.ones(3, 1)
    with pytest.raises(ValueError, match="block_k \\(256\\) must divide the fp8 weight blocks' 128 input features"):
        MOE.moe_experts(x, *q, w, ids, block_k=256)
    assert MOE.moe_config(3, 2, 1, 128, 128, scale_k=128, block_k=128)["block_k"] == 128
    MOE.moe_experts(x, *q, w, ids)
    q[2].scales = torch.ones(2, 2, 1)                        # [E, 2, 1] where down [128 -> 128] has [E, 1, 1]
    with pytest.raises(ValueError, match="w_down.scales"):
        MOE.moe_experts(x, *q, w, ids)


def test_fp8_experts_cost_counts_the_stored_weights_from_the_precision_registry():
    """stored_cost: roofline.formulas.moe_experts with each touched expert's weights as weight_bytes counts them.
    H 64, I 96, bf16, 2 distinct experts: per channel 3 * 6,144 values + (96 + 96 + 64) * 4 B scales = 19,456 B
    an expert (bf16: 36,864); per tensor 18,432 + 3 * 4 = 18,444; 128 x 128 blocks one block each: 18,444 too."""
    from roofline import formulas as F

    plain = F.moe_experts(1, 64, 96, 4, 2, distinct=2)
    for fmt, per in (("fp8", 19456), ("fp8-tensor", 18444), ("fp8-block", 18444)):
        c = MOE.stored_cost(1, 64, 96, 4, 2, fmt, "bf16", distinct=2)
        assert c.flops == plain.flops and plain.bytes - c.bytes == 2 * (36864 - per), fmt
    # biases in the activation dtype on top (GPT-OSS): (2 * 96 + 64) * 2 B an expert
    b = MOE.stored_cost(1, 64, 96, 4, 2, "fp8", "bf16", distinct=2, bias=True)
    assert b.bytes - MOE.stored_cost(1, 64, 96, 4, 2, "fp8", "bf16", distinct=2).bytes == 2 * 256 * 2


_MOE_COMPILE = textwrap.dedent("""
    import json, torch
    from kernels import compile_check as C, compile_launches as CL, variants as V
    from kernels._launch import recording
    out = {}
    for tgt in ("sm_80", "sm_90"):
        t = V.TARGETS[tgt]
        with recording(t.sms) as rec:       # the quick set's fp8 experts: batch 64, decode (skinny) and prefill (tiled)
            for ph in ("decode", "prefill"):
                for b in (1, CL.MOE_FP8_BATCH):
                    CL.moe_launches(rec, dict(model="x", phase=ph, b=b, ctx=128, dtype="bf16"), ph, b, 128,
                                    torch.bfloat16)
        vs = V.variants(t, [ln for ln in rec.launches if "fp8" in ln.context["op"]])
        out[tgt] = sorted({(v.kernel, v.config) for v in vs})
        # the ones that spilled on sm_80 before FP8_TILED_BLOCK_K: the tiled gate_up, per channel and 128 x 128 blocks
        pick = [v for v in vs if v.kernel == "_moe_gate_up_kernel" and "BLOCK_M=64" in v.config]
        out[tgt + " rows"] = [C.evaluate(v, C.compile_task(v.task(), t.capability), t) for v in pick]
    print(json.dumps(out))
""")


def test_the_compile_set_compiles_fp8_experts_on_both_targets_without_spills(tmp_path):
    """fp8 experts in bf16 at batch 64 only (``MOE_FP8_BATCH``): GPT-OSS's shapes per channel (QUANT 5), Mixtral's
    in 128 x 128 blocks (QUANT 6), skinny and tiled, gate_up and down: 8 variants a target, sm_80 included (the e4m3
    bytes are decoded as integers: no fp8 hardware); the tiled gate_up takes BLOCK_K 32 and does not spill."""
    pytest.importorskip("triton.backends.nvidia.compiler", reason="no NVIDIA backend in this triton")
    from tests.test_quant_runs import compile_script

    out = compile_script(_MOE_COMPILE, tmp_path)
    for tgt in ("sm_80", "sm_90"):
        assert len(out[tgt]) == 8, out[tgt]
        for code in ("QUANT=5 GROUP=0", "QUANT=6 GROUP=128"):
            assert {k for k, c in out[tgt] if code in c} == {"_moe_gate_up_kernel", "_moe_down_kernel"}, code
        rows = out[tgt + " rows"]
        assert len(rows) == 2
        for row in rows:
            assert "BLOCK_K=32" in row["config"] and row["status"] == "ok", row
            assert row["spill_stores"] == 0 and row["spill_loads"] == 0, row


def test_kv_append_fp8_is_bit_exact_with_its_reference_under_the_interpreter():
    """An fp8 KV cache's values: the kernel rounds to e4m3 in fp32 first (``act_quant.e4m3_round``), so the store
    casts an exact value; the interpreter's own cast drops a mantissa carry (31.7 -> 16; with the cast alone, 316 of
    16,384 random K and V values differed from ``quantize_kv_rows``'s correctly rounded one). Scales bit for bit."""
    from kernels import kv_append as KV

    g = gen(21)
    T, H, D, S, L = 64, 2, 64, 2, 40
    k, v = torch.randn(T, H, D, generator=g) * 3, torch.randn(T, H, D, generator=g)
    k[0, 0, :4] = torch.tensor([31.7, -31.7, 15.9, 448.0])          # values whose mantissa carries into the binade
    slot, pos = torch.arange(T) % S, torch.arange(T) // S
    got = []
    for fn in (KV.kv_append, KV.reference):
        kc = torch.zeros(S, H, L, D, dtype=torch.float8_e4m3fn)
        vc, sc = torch.zeros_like(kc), (torch.zeros(S, H, L), torch.zeros(S, H, L))
        fn(k, v, kc, vc, slot, pos, sc)
        got.append((kc.view(torch.uint8), vc.view(torch.uint8), *sc))
    for a, b in zip(*got):
        assert torch.equal(a, b)
    assert bool(got[0][0].any())
