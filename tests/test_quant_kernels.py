"""Weight-only int8 / int4 linears and the 8-bit KV cache against dequantized references, and bad input.

The Triton kernels run under the interpreter (tiny grids, odd shapes, outputs poisoned with NaN);
the torch backend runs the ecosystem's CPU ops. Run: pytest tests/test_quant_kernels.py
"""

from types import SimpleNamespace

import pytest
import torch
from click.testing import CliRunner

import kernels  # noqa: F401  (the interpreter before triton)
from kernels import decode_attention as DA
from kernels import kv_append as KV
from kernels import linear_int4 as L4
from kernels import linear_int8 as L8
from kernels import prefill_attention as PA
from kernels import quant as Q
from kernels.backend import get_ops
from kernels.check import KERNEL_TOL, quant_bound
from kernels.check_result import rel_err
from kernels.model import LlamaModel
from roofline.errors import RooflineError
from roofline.models import PRESETS

KINDS = [("int8", {}), ("int4", dict(group_size=32)), ("int4", dict(group_size=64, zero_point=True))]


def rnd(g, *shape, dtype=torch.float32):
    return torch.randn(*shape, generator=g).to(dtype)


def test_the_int4_packing_is_the_documented_one():
    # k = 2j in the low nibble of byte j, k = 2j+1 in the high one: [1, 2, 3, 4] -> 0x21, 0x43
    u = torch.tensor([[1, 2, 3, 4], [15, 0, 8, 7]])
    assert L4.pack(u).tolist() == [[0x21, 0x43], [0x0F, 0x78]]
    assert torch.equal(L4.unpack(L4.pack(u)), u)
    # dequant: (u - 8) x scale of the row's group: K = 64, g = 32, so k < 32 uses scales[0], k >= 32 scales[1]
    w = torch.zeros(64, 1)
    w[0, 0], w[40, 0] = 7.0, -14.0
    qw = L4.quantize(w, group_size=32)
    assert qw.scales[:, 0].tolist() == [1.0, 2.0] and L4.unpack(qw.qweight)[0, [0, 40]].tolist() == [15, 1]
    assert torch.equal(qw.dequantize(), w)


@pytest.mark.parametrize("kind,kw", KINDS)
def test_quantization_is_within_half_a_step(kind, kw):
    w = rnd(torch.Generator().manual_seed(0), 128, 40)
    qw = Q.quantize_weight(w, kind, **kw)
    step = qw.scales[None, :] if kind == "int8" else qw.scales.repeat_interleave(kw["group_size"], dim=0)
    assert ((qw.dequantize() - w).abs() <= step / 2 + 1e-6).all()


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("kind,kw", KINDS)
def test_triton_kernels_match_the_dequantized_reference(kind, kw, dtype):
    dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    g = torch.Generator().manual_seed(1)
    ops = get_ops("triton")
    # odd M and N, a K that is a multiple of the groups only; small blocks: several tiles; then split-K in one launch
    for M, N, K, cfg in [(5, 40, 192, dict(block_m=16, block_n=32, block_k=32)), (3, 24, 256, dict(split_k=3))]:
        x, w = rnd(g, M, K, dtype=dt), rnd(g, K, N, dtype=dt)
        qw = Q.quantize_weight(w, kind, **kw)
        y = ops.linear(x, qw, out=torch.full((M, N), float("nan"), dtype=dt), **cfg)
        ref = (L8 if kind == "int8" else L4).reference(x.double(), qw)
        assert rel_err(y, ref) <= KERNEL_TOL[dtype], (M, N, K, cfg)
        # against the unquantized weights: inside half a step per weight, summed (kernels.check.quant_bound)
        steps = qw.scales.double()[None, :].expand(K, -1) if kind == "int8" else \
            qw.scales.double().repeat_interleave(kw["group_size"], dim=0)
        bound = quant_bound(x, steps) + KERNEL_TOL[dtype] * (x.double() @ w.double()).abs().max()
        assert ((y.double() - x.double() @ w.double()).abs() <= bound).all()


def test_torch_backend_runs_the_ecosystem_ops_or_says_it_does_not():
    g = torch.Generator().manual_seed(2)
    ops = get_ops("torch")
    x = rnd(g, 3, 128)
    for kind, kw, N, impl in [("int8", {}, 40, "aten._weight_int8pack_mm"),
                              ("int4", dict(group_size=64), 48, "aten._weight_int4pack_mm_for_cpu"),
                              ("int4", dict(group_size=32, zero_point=True), 40, "dequantize reference")]:
        qw = Q.prepare_torch(Q.quantize_weight(rnd(g, 128, N), kind, **kw))
        assert qw.torch_impl.startswith(impl), qw.torch_impl          # N = 40: the CPU int4 op wants N % 16 == 0
        ref = (L8 if kind == "int8" else L4).reference(x.double(), qw)
        assert rel_err(ops.linear(x, qw), ref) <= 1e-5


def test_kv_append_quantizes_each_row_within_half_a_step_and_touches_nothing_else():
    g = torch.Generator().manual_seed(3)
    kc = torch.full((3, 2, 10, 12), 77, dtype=torch.int8)
    vc = kc.clone()
    ks, vs = torch.full((3, 2, 10), float("nan")), torch.full((3, 2, 10), float("nan"))
    k, v = rnd(g, 4, 2, 12, dtype=torch.bfloat16), rnd(g, 4, 2, 12, dtype=torch.bfloat16)
    k[1, 0] = 0                                                    # an all-zero row: zeros, scale 0
    sl, ps = torch.tensor([0, 2, 2, 1]), torch.tensor([9, 0, 1, 5])
    KV.kv_append(k, v, kc, vc, sl, ps, scales=(ks, vs))
    written = torch.zeros(3, 2, 10, dtype=torch.bool)
    written[sl, :, ps] = True
    for x, c, s in ((k, kc, ks), (v, vc, vs)):
        deq = c[sl, :, ps].double() * s[sl, :, ps].double()[..., None]
        assert ((deq - x.double()).abs() <= s[sl, :, ps].double()[..., None] / 2 + 1e-6).all()
        assert torch.isnan(s[~written]).all() and (c[~written] == 77).all()
    assert ks[2, 0, 0] == 0 and (kc[2, 0, 0] == 0).all()
    # the torch backend writes the same values: one rounding rule
    kc2, vc2, ks2, vs2 = torch.zeros_like(kc), torch.zeros_like(vc), torch.zeros_like(ks), torch.zeros_like(vs)
    KV.reference(k, v, kc2, vc2, sl, ps, scales=(ks2, vs2))
    assert torch.equal(kc2[written], kc[written]) and torch.equal(ks2[written], ks[written])


def test_attention_over_an_int8_cache_matches_the_dequantized_reference():
    g = torch.Generator().manual_seed(4)
    (kq, ksc), (vq, vsc) = (Q.quantize_kv_rows(torch.randn(3, 2, 64, 16, generator=g), "int8") for _ in range(2))
    sc = (ksc, vsc)
    q = rnd(g, 2, 19, 4, 16)
    slots = torch.tensor([2, 0])
    o = PA.prefill_attention(q, kq, vq, slots, 5, scales=sc, block_m=16, block_n=16,
                             out=torch.full_like(q, float("nan")))
    assert rel_err(o, PA.reference(q.double(), kq, vq, slots, 5, scales=sc)) <= KERNEL_TOL["fp32"]
    assert rel_err(PA.sdpa(q, kq, vq, slots, 5, scales=sc), PA.reference(q.double(), kq, vq, slots, 5, scales=sc)) \
        <= KERNEL_TOL["fp32"]
    qd, lens = rnd(g, 3, 4, 16), torch.tensor([37, 0, 60])
    slots = torch.tensor([1, 0, 2])
    ref = DA.reference(qd.double(), kq, vq, lens, slots, scales=sc)
    o = DA.decode_attention(qd, kq, vq, lens, slots, scales=sc, block_n=16, splits=3,
                            out=torch.full_like(qd, float("nan")))
    assert rel_err(o, ref) <= KERNEL_TOL["fp32"]
    assert rel_err(DA.torch_decode(qd, kq, vq, lens, slots, scales=sc), ref) <= KERNEL_TOL["fp32"]
    with pytest.raises(ValueError, match="needs scales=\\(k_scale, v_scale\\)"):
        DA.decode_attention(qd, kq, vq, lens, slots)


# ---------------------------------------------------------------- bad input: one line, naming what is allowed

def one_line(e) -> str:
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_int4_group_that_does_not_divide_k():
    w = torch.zeros(96, 16)
    with pytest.raises(RooflineError) as e:
        Q.quantize_weight(w, "int4", group_size=64, name="wq")
    assert one_line(e) == "int4 group size 64 must divide wq's in-features K = 96: give a group size of 32."
    with pytest.raises(RooflineError) as e:                        # tiny: hidden 64, intermediate 176
        LlamaModel(PRESETS["tiny"], dtype="fp32", backend="torch", weight_dtype="int4", group_size=32)
    assert "does not divide tiny's down_proj in-features (176)" in one_line(e) and "use int8 weights" in str(e.value)
    with pytest.raises(RooflineError) as e:
        Q.quantize_weight(torch.zeros(64, 16), "int4", group_size=48)
    assert one_line(e) == "the int4 group size must be one of 32, 64, 128, but 48 was given."


def test_fp8_kv_on_a_device_without_fp8():
    with pytest.raises(RooflineError) as e:
        LlamaModel(PRESETS["tiny"], dtype="fp32", backend="torch", kv_dtype="fp8")
    assert "fp8 (e4m3) KV cache needs a GPU with fp8" in one_line(e) and "use --kv-dtype int8" in str(e.value)
    with pytest.raises(RooflineError) as e:
        LlamaModel(PRESETS["tiny"], dtype="fp32", backend="torch", kv_dtype="int4")
    assert "is fp32 (the activation dtype) or 8-bit (int8 or fp8), but 'int4' was given" in one_line(e)


def test_int4_on_the_torch_backend_without_the_op(monkeypatch):
    monkeypatch.setattr("kernels.quant_weight.aten", lambda: SimpleNamespace())      # a torch with no int4 GEMM
    with pytest.raises(RooflineError) as e:
        Q.check_torch_int4("cpu")
    assert "need torch.ops.aten._weight_int4pack_mm_for_cpu (torch >= 2.5)" in one_line(e)
    assert "use the triton backend, or int8 weights" in str(e.value)
    with pytest.raises(RooflineError, match="_weight_int4pack_mm_for_cpu"):
        Q.prepare_torch(Q.quantize_weight(torch.randn(64, 16), "int4", group_size=32))


@pytest.mark.parametrize("args,needle", [
    (["profile", "--model", "tiny", "--weight-dtype", "int4"], "int4 group size 128 does not divide tiny's"),
    (["profile", "--model", "tiny", "--kv-dtype", "fp8"], "fp8 (e4m3) KV cache needs a GPU with fp8"),
    (["profile", "--model", "tiny", "--weight-dtype", "int3"], "--weight-dtype must be fp8, fp8-tensor, fp8-block, mxfp4, nvfp4, int8, int4 or module=format pairs"),
    (["profile", "--model", "tiny", "--weight-dtype", "bf16,int8"], "--weight-dtype bf16: the weights are held in the activation dtype (fp32: unquantized) or a quantized format"),
    (["profile", "--model", "tiny", "--weight-dtype", "int8", "--zero-point"], "--zero-point goes with int4"),
    (["profile", "--model", "small", "--weight-dtype", "int4", "--tp", "2"], "per rank at --tp 2 (704 of 1408)"),
    (["profile", "--model", "small", "--weight-dtype", "int4", "--group-size", "48"], "--group-size must be one of"),
    (["latency", "--model", "tiny", "--weight-dtype", "int8,int4"], "--weight-dtype takes one of fp8, fp8-tensor, fp8-block, mxfp4, nvfp4, int8, int4"),
    (["latency", "--model", "tiny", "--kv-dtype", "fp8"], "fp8 (e4m3) KV cache needs a GPU with fp8"),
    (["latency", "--endpoint", "http://127.0.0.1:9", "--weight-dtype", "int8"], "--weight-dtype shapes the in-process"),
    (["serve", "--model", "tiny", "--weight-dtype", "int4", "--group-size", "64"], "does not divide tiny's"),
])
def test_bad_quantization_options_stop_before_anything_runs(args, needle, tmp_path, monkeypatch):
    import profiler.kernel_checks as K
    from profiler.cli import main

    monkeypatch.setattr(K, "validate_kernels", lambda *a, **k: pytest.fail("validated kernels"))
    r = CliRunner().invoke(main, args + (["--out", str(tmp_path / "o")] if args[0] != "serve" else []))
    assert r.exit_code != 0 and needle in r.output, r.output
    assert not (tmp_path / "o" / "results.jsonl").exists() and not (tmp_path / "o" / "latency.jsonl").exists()


# ---- every registered format through both backends' linear, and its tensor-parallel cuts -------------------

def _format_reference(x, qw):
    """The format's own reference: fp8's W8A8 (x quantized as the kernels do), the others x @ dequant(W)."""
    from kernels import linear_fp8 as LF

    if qw.dtype in LF.FORMATS:
        return LF.reference(x, qw).double()
    return x.double() @ qw.dequantize(torch.float64)


@pytest.mark.parametrize("fmt", sorted(Q.FORMATS))
def test_every_registered_format_runs_through_both_backends_linear(fmt):
    """get_ops(b).linear dispatches by the registry (``triton_linear`` / ``torch_linear``). Tolerance: bf16 output
    rounding (2^-8 relative) plus the dequantized weight's bf16 rounding on the torch path, 2^-6 of max |ref| in
    all; a wrong scale or a wrong kernel is far over it (the weights' own quantization error is ~1e-2)."""
    g = torch.Generator().manual_seed(1)
    K, N = 256, 160
    qw = Q.quantize_weight((rnd(g, K, N) * 0.05).to(torch.bfloat16), fmt)
    x = rnd(g, 3, K, dtype=torch.bfloat16)
    ref = _format_reference(x, qw)
    for backend in ("triton", "torch"):
        y = get_ops(backend).linear(x, qw)
        assert y.shape == (3, N) and y.dtype == torch.bfloat16
        err = float((y.double() - ref).abs().max() / ref.abs().max())
        assert err <= 2.0 ** -6, (fmt, backend, err)
    assert Q.FORMATS[fmt].triton_linear.__name__.startswith("linear_")


def test_an_unregistered_weight_dtype_is_refused_in_one_line():
    qw = Q.quantize_weight(torch.randn(64, 32), "int8")
    qw.dtype = "int3"
    with pytest.raises(RooflineError) as e:
        get_ops("triton").linear(torch.randn(2, 64), qw)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("no quantized weight format 'int3': the registered ones are ")
    assert "fp8-block" in msg and "nvfp4" in msg and "int8" in msg


# (axis, start, stop) of a [K, N] = [256, 160] weight: whole 128-blocks / groups, and fp8-block's partial last one
CUTS = (("out", 0, 128), ("out", 128, 160), ("in", 0, 128), ("in", 128, 256), ("out", 32, 64), ("in", 32, 64))


@pytest.mark.parametrize("fmt", sorted(Q.FORMATS))
def test_slices_dequantize_to_the_slices_of_the_dequantization(fmt):
    """slice_quant (the format's ``slice``) of a QuantWeight and of QuantExperts, each axis: bit for bit the same
    slice of the full dequantization; fp8-block refuses a cut through a 128-block (ValueError); pad_out's channels
    dequantize to 0. nvfp4's tensor scale and FP4's activation dtype survive the cut."""
    g = torch.Generator().manual_seed(2)
    K, N = 256, 160
    kw = dict(group_size=32) if fmt == "int4" else {}
    qw = Q.quantize_weight((rnd(g, K, N) * 0.05).to(torch.bfloat16), fmt, **kw)
    qe = Q.quantize_experts((rnd(g, 3, K, N) * 0.05).to(torch.bfloat16), fmt, **kw)
    full, fe = qw.dequantize(torch.float64), qe.dequantize(torch.float64)
    blocks = fmt == "fp8-block"
    for axis, a, b in CUTS:
        if blocks and 32 in (a, b):
            for q in (qw, qe):
                with pytest.raises(ValueError, match="cuts a 128-block"):
                    Q.slice_quant(q, axis, a, b)
            continue
        s, se = Q.slice_quant(qw, axis, a, b), Q.slice_quant(qe, axis, a, b)
        want = full[:, a:b] if axis == "out" else full[a:b]
        assert torch.equal(s.dequantize(torch.float64), want), (fmt, axis, a, b)
        assert torch.equal(se.dequantize(torch.float64), fe[..., a:b] if axis == "out" else fe[:, a:b])
        assert s.shape == tuple(want.shape) and (s.act, s.torch_impl) == (qw.act, "")
        assert (s.tensor_scale is None) == (qw.tensor_scale is None)
        assert s.qweight.data_ptr() != qw.qweight.data_ptr()          # a copy: the shard outlives the full weight
    se = Q.slice_quant(qe, "experts", 1, 3)
    assert torch.equal(se.dequantize(torch.float64), fe[1:3]) and se.n_experts == 2
    p = Q.pad_out(qw, 300)
    d = p.dequantize(torch.float64)
    assert p.shape == (K, 300) and torch.equal(d[:, :N], full) and not d[:, N:].any()
    assert Q.pad_out(qw, N) is qw


def test_a_padded_and_sliced_fp8_block_lm_head_runs_on_both_backends():
    """The vocab-parallel lm_head's path (pad_out, then an "out" slice) for 128 x 128 blocks: a partial last block
    padded (its new rows keep its scale, their values 0), then cut at whole blocks; each backend's linear runs it."""
    g = torch.Generator().manual_seed(3)
    qw = Q.quantize_weight(rnd(g, 128, 200) * 0.05, "fp8-block")
    p = Q.pad_out(qw, 256)
    assert tuple(p.scales.shape) == (2, 1)
    part = Q.slice_quant(p, "out", 128, 256)
    want = qw.dequantize(torch.float64)[:, 128:]
    assert torch.equal(part.dequantize(torch.float64)[:, :72], want) and not part.dequantize()[:, 72:].any()
    x = rnd(g, 2, 128, dtype=torch.bfloat16)
    for backend in ("triton", "torch"):
        y = get_ops(backend).linear(x, part)
        assert y.shape == (2, 128) and not y[:, 72:].any()


def test_run_configs_say_each_format_as_the_precision_registry_labels_it_with_its_own_tiles():
    """linear_run_config / expert_weights_config read the label from roofline.precision (int4 with its group and
    zero points); the triton config is the format's kernel's (fp8: linear_fp8_config, BLOCK_K 128; int4: BLOCK_K
    at most the group; FP4: linear_fp4_config); the torch backend says what runs (fp8 experts: weight-only)."""
    from kernels import linear_fp4 as LF4
    from kernels import linear_fp8 as LF
    from kernels.runners_linear import linear_run_config

    g = torch.Generator().manual_seed(4)
    w = rnd(g, 256, 192)
    tri = SimpleNamespace(triton=True, dt=torch.bfloat16, dev=torch.device("cpu"))
    tor = SimpleNamespace(triton=False, dt=torch.bfloat16, dev=torch.device("cpu"))
    want = {"int8": "int8 (per channel)", "int4": "int4 (g32, zero points)", "fp8": "fp8 e4m3 (per channel)",
            "fp8-tensor": "fp8 e4m3 (per tensor)", "fp8-block": "fp8 e4m3 (128x128 blocks)",
            "mxfp4": "mxfp4 (blocks of 32, e8m0 scales)", "nvfp4": "nvfp4 (blocks of 16, e4m3 scales, fp32 tensor scale)"}
    assert set(want) == set(Q.FORMATS)
    for fmt, label in want.items():
        kw = dict(group_size=32, zero_point=True) if fmt == "int4" else {}
        qw = Q.quantize_weight(w, fmt, **kw)
        c = linear_run_config(tri, 8, qw)
        assert c["weights"] == label, fmt
        tiles = {k: v for k, v in c.items() if k != "weights"}
        if fmt in LF.FORMATS:
            assert tiles == LF.linear_fp8_config(8, 192, 256, "cpu", block=fmt == "fp8-block") and tiles["block_k"] == 128
        elif fmt == "int4":
            assert tiles == L4.linear_int4_config(8, 192, 256, 32, torch.bfloat16, "cpu", zero_point=True)
            assert tiles["block_k"] == 32 and tiles["num_stages"] <= 3
        elif fmt in ("mxfp4", "nvfp4"):
            assert tiles == LF4.linear_fp4_config(8, 192, 256, torch.bfloat16, "cpu")
        Q.prepare_torch(qw)
        assert linear_run_config(tor, 8, qw) == {"weights": label, "impl": qw.torch_impl}
        qe = Q.quantize_experts(w[None].expand(2, -1, -1), fmt, **kw)
        assert Q.expert_weights_config(qe, "triton") == {"weights": label}
        impl = Q.expert_weights_config(qe, "torch")["impl"]
        assert impl.startswith("per expert: ") and (("weight-only (W8A16" in impl) == (fmt in LF.FORMATS)), impl
