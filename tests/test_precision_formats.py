"""The format registry (roofline.precision): every weight layout counted to the byte, the arithmetic beside it."""

import pytest

from roofline import formulas as F
from roofline.errors import RooflineError
from roofline.precision import (Format, Scales, act_format, gemm_compute, kv_format, names, register, weight_bytes,
                                weight_format)
from roofline.precision import formats


def test_layouts_to_the_byte():
    wb = lambda name, K, N, act="bf16": weight_bytes(weight_format(name), K, N, act)  # noqa: E731
    assert wb("bf16", 4096, 4096) == 4096 * 4096 * 2 == 33_554_432          # the seed's 4,096 x 4,096 BF16 weight
    assert wb("fp8", 4096, 1024) == 4096 * 1024 + 1024 * 4                   # per channel: an fp32 per output
    assert wb("fp8-tensor", 4096, 1024) == 4096 * 1024 + 4                   # per tensor: one fp32
    # DeepSeek-V3's expert gate_proj [7168 -> 2048]: 56 x 16 blocks of 128 x 128, an fp32 scale_inv each
    assert wb("fp8-block", 7168, 2048) == 14_680_064 + 56 * 16 * 4 == 14_683_648
    # gpt-oss's experts gate_up [2880 -> 5760]: two e2m1 per byte, an e8m0 per 32 inputs
    assert wb("mxfp4", 2880, 5760) == 2880 * 5760 // 2 + 90 * 5760 == 8_812_800
    # NVFP4: an e4m3 per 16 inputs and one fp32 for the tensor
    assert wb("nvfp4", 4096, 4096) == 8_388_608 + 256 * 4096 + 4 == 9_437_188
    assert wb("mxfp8", 4096, 4096) == 16_777_216 + 128 * 4096
    # GPTQ g128: qweight, fp16 scales, int4 qzeros, an int32 g_idx per input row
    assert wb("gptq-int4", 5120, 5120) == 13_107_200 + 40 * 5120 * 2 + 40 * 5120 // 2 + 5120 * 4 == 13_639_680
    assert wb("awq-int4", 5120, 5120) == 13_107_200 + 40 * 5120 * 2 + 40 * 5120 // 2
    # A ragged edge rounds the scales up: 100 inputs in blocks of 128 -> 1 block row
    assert wb("fp8-block", 100, 300) == 30_000 + 1 * 3 * 4


@pytest.mark.parametrize("name,g,zp", [("int8", None, False), ("int4", 128, False), ("int4", 32, True),
                                       ("int4", 64, False)])
@pytest.mark.parametrize("act", ["bf16", "fp32"])
def test_our_int_layouts_equal_the_formulas(name, g, zp, act):
    """Our kernels' int8 / int4 layouts: the registry counts what formulas.quantized_weight_bytes always did."""
    assert weight_bytes(weight_format(name, g, zp), 768, 320, act) == F.quantized_weight_bytes(
        768, 320, weight_dtype=name, act_dtype=act, group_size=g, zero_point=zp)


def test_names_per_role_and_refusals():
    assert weight_format("FP8").label == "fp8 e4m3 (per channel)"
    assert act_format("fp8").label == "fp8 e4m3 (per-token dynamic scales)"
    assert kv_format("float8_e4m3fn").name == "fp8" and kv_format("fp8").scales.n == 1
    assert kv_format("fp8-e5m2").element == "e5m2"
    assert "nvfp4" in names("weight") and "nvfp4" in names("act") and "nvfp4" not in names("kv")
    with pytest.raises(RooflineError, match=r"^unknown weight format 'fp9': choose one of fp32, bf16, fp16, fp8, "):
        weight_format("fp9")
    with pytest.raises(RooflineError, match="unknown KV-cache format 'mxfp4'"):
        kv_format("mxfp4")
    with pytest.raises(RooflineError, match="the int4 group size must be one of 32, 64, 128, but 48 was given"):
        weight_format("int4", 48)
    assert weight_format("int4", 32, True).label == "int4 (g32, zero points)"


def test_compute_path():
    hopper = {"bf16", "fp16", "fp8", "int8"}.__contains__
    blackwell = {"bf16", "fp16", "fp8", "int8", "fp4"}.__contains__
    ampere = {"bf16", "fp16", "int8"}.__contains__
    w8, a8, a16 = weight_format("fp8-block"), act_format("fp8-group"), act_format("bf16")
    assert gemm_compute(w8, a8, hopper) == "fp8"          # W8A8 at the fp8 tensor-core rate
    assert gemm_compute(w8, a8, ampere) == "bf16"         # no fp8 tensor cores: dequantized, bf16 rate
    assert gemm_compute(w8, a16, hopper) == "bf16"        # W8A16
    w4, a4 = weight_format("nvfp4"), act_format("nvfp4")
    assert gemm_compute(w4, a4, blackwell) == "fp4"       # W4A4 at the fp4 rate
    assert gemm_compute(w4, a4, hopper) == "bf16"         # W4A4 where the device has no fp4: as W4A16
    assert gemm_compute(weight_format("mxfp4"), a16, blackwell) == "bf16"
    assert gemm_compute(weight_format("int4"), act_format("fp16"), hopper) == "fp16"


def test_a_new_format_is_one_entry():
    """Adding a format: one registry entry, and its bytes, names and compute path follow."""
    fmt = Format("toy-fp6", "e3m2", 6, Scales(32, 1, "e8m0"), ("weight",), "act", (10, 0), "fp6 (toy)", group_size=32)
    try:
        register(fmt, "fp6")
        assert weight_format("fp6") is fmt
        assert weight_bytes(fmt, 64, 10) == 64 * 10 * 6 / 8 + 2 * 10
        with pytest.raises(RooflineError, match="'fp6' already names a weight format"):
            register(Format("toy-other", "e3m2", 6), "fp6")
    finally:
        formats.FORMATS.pop(("weight", "toy-fp6"))
        formats.ALIASES.pop(("weight", "fp6"))
