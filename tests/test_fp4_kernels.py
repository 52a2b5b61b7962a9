"""FP4 weights (issue 29): kernels.fp4's formats, kernels.linear_fp4 and kernels.moe's FP4 experts, and their
``roofline check`` rows (kernels.check_fp4). The Triton kernels run under the interpreter (TRITON_INTERPRET=1,
set by kernels.env on a CPU): uint8 loads, integer ops and bitcasts to fp32 all run there.

Run: pytest tests/test_fp4_kernels.py
"""

import pytest
import torch

import kernels.env  # noqa: F401  (the interpreter on a CPU)
from kernels import check_fp4 as CF, fp4
from kernels.backend import get_ops
from kernels.check import rel_err
from kernels.quant import torch_linear
from kernels.quant_weight import weight_format

FORMATS = ("mxfp4", "nvfp4")


def _representable(fmt, K=64, N=24, seed=0):
    """A [K, N] weight every block of which is e2m1 values x its scale (x the tensor scale): what quantize keeps."""
    g = torch.Generator().manual_seed(seed)
    f = fp4.fp4_format(fmt)
    codes = torch.randint(0, 16, (N, K), generator=g)
    codes[codes == 8] = 0                                               # -0 is stored as +0
    codes[:, :: f.group_size] = 7                                       # every block reaches 6: its amax
    if fmt == "mxfp4":
        scales = torch.randint(120, 131, (N, K // f.group_size), generator=g).to(torch.uint8)
        q = fp4.QuantWeight(fmt, fp4.pack(codes), scales, None, K, N, f.group_size, act=torch.float32)
    else:
        scales = torch.tensor([1.0, 0.875, 2.5, 448.0, 0.25])[torch.randint(0, 5, (N, K // 16), generator=g)]
        q = fp4.QuantWeight(fmt, fp4.pack(codes), scales.to(torch.float8_e4m3fn), None, K, N, 16,
                            tensor_scale=torch.tensor(2.0 ** -7), act=torch.float32)
    return q


@pytest.mark.parametrize("fmt", FORMATS)
def test_representable_weights_round_trip_exactly(fmt):
    q = _representable(fmt)
    w = q.dequantize(torch.float64)
    back = fp4.quantize(w.float(), fmt)
    assert torch.equal(back.dequantize(torch.float64), w)
    if fmt == "mxfp4":                                     # e8m0: the same bytes (the exponent is determined)
        assert torch.equal(back.qweight, q.qweight) and torch.equal(back.scales, q.scales)
    assert back.scales.dtype == fp4.SCALE_STORAGE[fp4.fp4_format(fmt).scales.dtype]
    assert back.qweight.shape == (24, 32) and back.scales.shape == (24, 64 // back.group_size)


def test_e2m1_codes_nibble_order_and_ties():
    assert fp4.E2M1_VALUES[:8] == (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
    c = torch.arange(16)
    assert fp4.encode_e2m1(fp4.decode_e2m1(c)).tolist() == [0, *range(1, 8), 0, *range(9, 16)]   # -0 -> +0
    # midpoints go to the even code: 0.25 -> 0, 0.75 -> 1.0, 1.25 -> 1.0, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, -9.0])
    assert fp4.encode_e2m1(mids).tolist() == [0, 2, 2, 4, 4, 6, 6, 7, 15]
    assert fp4.pack(torch.tensor([[1, 2, 3, 4]])).tolist() == [[0x21, 0x43]]          # low nibble first


def test_mxfp4_dequantizes_as_transformers_does():
    mx = pytest.importorskip("transformers.integrations.mxfp4")
    assert tuple(mx.FP4_VALUES) == fp4.E2M1_VALUES
    g = torch.Generator().manual_seed(3)
    q = fp4.quantize_experts(torch.randn(2, 64, 40, generator=g), "mxfp4")          # [E, K, N]
    blocks = q.qweight.reshape(2, 40, 2, 16)                                        # gpt-oss's *_blocks
    ref = mx.convert_moe_packed_tensors(blocks, q.scales, dtype=torch.float32)       # [E, K, N]
    assert torch.equal(ref, q.dequantize(torch.float32))


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_registry_formats_and_the_torch_path(fmt):
    w = torch.randn(64, 40, generator=torch.Generator().manual_seed(1))
    q = weight_format(fmt).quantize(w)
    assert q.dtype == fmt and q.act_dtype == torch.float32
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(2))
    assert rel_err(torch_linear(x, q), x.double() @ q.dequantize(torch.float64)) < 1e-6
    assert q.torch_impl.startswith("dequantize reference")
    # within a quarter of its block's amax: half e2m1's widest step (4 -> 6: s, amax >= 4 s), or mxfp4's saturation
    # (amax < 8 s kept as 6 s: 2 s <= amax / 4)
    g = q.group_size
    amax = w.double().t().reshape(40, 64 // g, g).abs().amax(-1).repeat_interleave(g, -1).t()
    assert bool(((q.dequantize(torch.float64) - w.double()).abs() <= amax / 4).all())


def test_costs_come_from_the_precision_registry():
    # 1 x 64 @ 64 x 96 bf16: 2*64*96 = 12,288 FLOPs; x 128 B + y 192 B; mxfp4 weight 64*96/2 = 3,072
    # + (64/32)*96 = 192 e8m0 scales -> 3,584 B; nvfp4 3,072 + (64/16)*96 = 384 e4m3 scales + 4 (fp32) -> 3,780 B
    c = fp4.linear_cost(1, 64, 96, "mxfp4", "bf16")
    assert (c.flops, c.bytes) == (12288, 3584)
    assert fp4.linear_cost(1, 64, 96, "nvfp4", "bf16").bytes == 3780
    assert fp4.linear_cost(1, 64, 96, "nvfp4", "bf16", bias=True).flops == 12288 + 96
    # MoE: bf16's cost with each touched expert's weights as mxfp4: distinct = 2 experts, H 64, I 96:
    # bf16 3*64*96*2 = 36,864 B an expert -> mxfp4 3*3,072 + 2*192 + (96/32)*64 = 9,216 + 384 + 192 = 9,792 B
    from roofline import formulas as F
    plain = F.moe_experts(1, 64, 96, 4, 2, distinct=2)
    from kernels.moe import stored_cost
    c = stored_cost(1, 64, 96, 4, 2, "mxfp4", "bf16", distinct=2)
    assert c.flops == plain.flops and plain.bytes - c.bytes == 2 * (36864 - 9792)


def _rows(backend, scale_error=0.0, dt=torch.float32):
    return [(n, rel_err(o, r), t) for n, o, r, t, _ in CF.fp4_rows(get_ops(backend), dt, torch.device("cpu"),
                                                                   scale_error)]


@pytest.mark.parametrize("backend", ("triton", "torch"))
def test_check_rows_pass_and_fail_when_a_scale_is_1_percent_off(backend):
    rows = _rows(backend)
    names = [n for n, _, _ in rows]
    assert len(rows) == 10 and "experts_mxfp4 T=5 E=4 k=2 swiglu_oai +bias" in names
    assert {n.split()[0] for n in names} == {"linear_mxfp4", "linear_nvfp4", "experts_mxfp4", "experts_nvfp4"}
    assert all(e <= t for _, e, t in rows), [r for r in rows if r[1] > r[2]]
    off = _rows(backend, scale_error=0.01)       # nvfp4: the tensor scale; mxfp4: the dequantized scales
    assert all(e > t for _, e, t in off), [r for r in off if r[1] <= r[2]]
    assert all(e > 0.005 for _, e, _ in off)
    assert max(t for _, _, t in rows) == 1e-5


@pytest.mark.parametrize("backend", ("triton", "torch"))
@pytest.mark.parametrize("dt", (torch.bfloat16, torch.float16))
def test_16_bit_rows_pass_and_a_1_percent_scale_still_fails(backend, dt):
    rows, off = _rows(backend, dt=dt), _rows(backend, scale_error=0.01, dt=dt)
    assert all(e <= t for _, e, t in rows), [r for r in rows if r[1] > r[2]]
    assert all(e > t for _, e, t in off), [r for r in off if r[1] <= r[2]]


def test_run_checks_carries_the_fp4_rows():
    import torch

    from kernels import check as CK
    from kernels.backend import get_ops
    from kernels.runner_registry import CHECKS

    fp4 = CHECKS["fp4"]                                                      # roofline check's FP4 group
    assert fp4.part == "quant" and fp4.kinds == ("linear", "experts")
    rows = fp4.rows(get_ops("torch"), torch.float32, torch.device("cpu"), True, "tiny")
    assert [r.name for r in rows][:1] == ["linear_mxfp4 M=37 N=70 K=96"] and len(rows) == 10
    assert all(r.passed for r in rows), [str(r) for r in rows if not r.passed]
    names = [r.name for r in CK.run_checks("torch", "fp32", "cpu", parts=("quant",))]
    assert names[names.index("linear_mxfp4 M=37 N=70 K=96"):][:10] == [r.name for r in rows]


def test_the_triton_kernels_refuse_other_weights():
    from kernels.linear_fp4 import linear_fp4
    from kernels.quant import quantize_weight

    with pytest.raises(ValueError, match="FP4 QuantWeight"):
        linear_fp4(torch.zeros(1, 64), quantize_weight(torch.zeros(64, 32), "int4", group_size=32))
    q = fp4.quantize(torch.randn(64, 32), "nvfp4")
    with pytest.raises(ValueError, match="activation dtype"):
        linear_fp4(torch.zeros(1, 64, dtype=torch.bfloat16), q)
    with pytest.raises(Exception, match="multiple of its block of 32"):
        fp4.quantize(torch.zeros(48, 8), "mxfp4")
