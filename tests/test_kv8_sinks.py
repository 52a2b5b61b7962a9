"""An 8-bit KV cache with attention sinks (GPT-OSS): the Triton kernels' KV_QUANT and SINKS paths together, the torch
sink path's dequantization, and the tiny GPT-OSS model with ``kv_dtype="int8"``.

The prefill kernel starts its online softmax at the sink and applies the per-token K / V scales inside the key loop;
the decode split kernel applies the scales and the merge adds the sink: one kernel each, both flags set. Against a
float64 reference over the dequantized cache (values x scales, then ``kernels.sinks`` in float64) to 1e-5 of the
largest output (fp32 under the interpreter): prefill with a cached prefix and a window, decode over several splits
with lengths on both sides of the window. The model: int8 KV on the triton backend against the same checkpoint with
a float cache, within 3% of the largest logit (measured 2.2%; tests/test_quant_runs.py bounds the tiny llama at 2%,
measured 0.5%: this checkpoint's logits are small) with top-1 on 90% of the positions, and against the torch backend's
int8 path to 1e-4 (the same quantized cache, two code paths).

Run: pytest tests/test_kv8_sinks.py   (about 30 s on 2 cores: interpreter launches, one tiny checkpoint)
"""

import pytest
import torch

import kernels  # noqa: F401  (sets TRITON_INTERPRET before triton loads)
from kernels import decode_attention as DA
from kernels import prefill_attention as PA
from kernels import sinks as SK
from kernels.check_result import rel_err
from kernels.quant import quantize_kv_rows
from roofline.errors import RooflineError

TOL = 1e-5          # fp32 kernel vs float64 reference, relative to the largest output (check.KERNEL_TOL["fp32"])


def nan(*shape):
    return torch.full(shape, float("nan"))


def int8_cache(g, *shape):
    """(int8 values, fp32 scales [..]) of a random cache, and its dequantized float64 values (what the kernels
    stand for)."""
    q, s = quantize_kv_rows(torch.randn(*shape, generator=g), "int8")
    return q, s, q.double() * s.double()[..., None]


SINKS = torch.tensor([4.0, -4.0, 0.5, -25.0, 12.0, -1.0, 2.0, 0.0])   # large, small and neutral sinks


# (B, n, cached, Hq, Hkv, D, window, blocks)
PREFILL = [
    (2, 37, 0, 4, 2, 16, None, dict(block_m=16, block_n=16)),    # GQA, n not a multiple of the tiles
    (1, 30, 11, 4, 1, 24, None, dict(block_m=16, block_n=16)),   # a cached prefix, D not 16k
    (2, 23, 29, 4, 2, 16, 5, dict(block_m=16, block_n=16)),      # window smaller than a tile
    (1, 41, 13, 8, 2, 16, 20, dict(block_m=32, block_n=16)),     # window over several tiles
]


@pytest.mark.parametrize("B,n,p,Hq,Hkv,D,W,cfg", PREFILL)
def test_triton_prefill_int8_kv_with_sinks_equals_float64_on_dequantized_kv(B, n, p, Hq, Hkv, D, W, cfg):
    g = torch.Generator().manual_seed(n * 7 + p)
    kq, ks, kd = int8_cache(g, 3, Hkv, 80, D)
    vq, vs, vd = int8_cache(g, 3, Hkv, 80, D)
    q, slots, sinks = torch.randn(B, n, Hq, D, generator=g) * 2, torch.tensor([2, 0][:B]), SINKS[:Hq]
    o = PA.prefill_attention(q, kq, vq, slots, p, window=W, sinks=sinks, scales=(ks, vs), out=nan(B, n, Hq, D),
                             **cfg)
    ref = SK.prefill_with_sinks(q.double(), kd, vd, slots, p, sinks=sinks.double(), window=W)
    assert o.shape == (B, n, Hq, D) and torch.isfinite(o).all()
    assert rel_err(o, ref) < TOL
    # the torch backend's path dequantizes the same cache: the same numbers
    assert rel_err(SK.prefill_with_sinks(q, kq, vq, slots, p, sinks=sinks, window=W, scales=(ks, vs)), ref) < TOL
    # both features matter here: without the sinks, or on the float cache the values came from, it differs
    plain = PA.reference(q.double(), kd, vd, slots, p, window=W)
    assert rel_err(plain, ref) > 1e-2


# (Hq, Hkv, D, lengths, window, blocks)
DECODE = [
    (4, 2, 16, [37, 1, 60, 17], 16, dict(block_n=16, splits=3)),   # lengths on both sides of the window
    (8, 2, 24, [50, 13], None, dict(block_n=16, splits=3)),        # several splits, no window
    (4, 1, 16, [45, 9], 7, dict(block_n=16)),
]


@pytest.mark.parametrize("Hq,Hkv,D,lens,W,cfg", DECODE)
def test_triton_decode_int8_kv_with_sinks_equals_float64_on_dequantized_kv(Hq, Hkv, D, lens, W, cfg):
    g = torch.Generator().manual_seed(sum(lens))
    B = len(lens)
    kq, ks, kd = int8_cache(g, 4, Hkv, 64, D)
    vq, vs, vd = int8_cache(g, 4, Hkv, 64, D)
    q, sinks = torch.randn(B, Hq, D, generator=g) * 2, SINKS[:Hq]
    slots, ln = torch.tensor([3, 0, 1, 2][:B]), torch.tensor(lens)
    o = DA.decode_attention(q, kq, vq, ln, slots, window=W, sinks=sinks, scales=(ks, vs), out=nan(B, Hq, D), **cfg)
    ref = SK.decode_with_sinks(q.double(), kd, vd, ln, slots, sinks=sinks.double(), window=W)
    assert rel_err(o, ref) < TOL
    assert rel_err(SK.decode_with_sinks(q, kq, vq, ln, slots, sinks=sinks, window=W, scales=(ks, vs)), ref) < TOL
    assert rel_err(DA.reference(q.double(), kd, vd, ln, slots, window=W), ref) > 1e-2   # the sinks matter


# ---------------------------------------------------------------- the tiny GPT-OSS model

@pytest.fixture(scope="module")
def gpt_oss():
    import hf_tiny_moe as H

    H.require("gpt_oss")
    from roofline.models import load_model

    return load_model(H.checkpoint("gpt_oss")), torch.tensor(H.tokens())


def test_tiny_gpt_oss_with_an_int8_kv_cache_on_triton_stays_close_to_the_float_model(gpt_oss):
    """Prefill 10 tokens then decode 10 (past the window of 8) on the triton backend with an int8 cache, against the
    same checkpoint with an fp32 cache (torch backend, forward_full) and against the torch backend's int8 cache."""
    from kernels.model import LlamaModel

    cfg, seq = gpt_oss
    n, p = 20, 10
    kw = dict(dtype="fp32", max_slots=1, max_len=n)
    ref = LlamaModel(cfg, backend="torch", **kw).forward_full(seq[None, :n]).double()[p - 1:n]      # [11, vocab]
    runs = {}
    for be in ("triton", "torch"):
        m = LlamaModel(cfg, backend=be, kv_dtype="int8", **kw)
        assert m.k_cache.dtype == torch.int8 and m.quant_label == "int8 KV cache"
        runs[be] = torch.stack([m.prefill(seq[:p], 0)] + [m.decode_step(seq[i: i + 1], [0])[0]
                                                           for i in range(p, n)]).double()
    tri, scale = runs["triton"], ref.abs().max()
    diff = float((tri - ref).abs().max())
    # quantization moved the logits, a little: measured 2.2% of the largest logit (2.8), 11/11 top-1. The tiny
    # llama's int8 KV bound (tests/test_quant_runs.py) is 2% at a measured 0.5%; this checkpoint's logits are
    # small, so the same rounding is a larger share of them: 3% here (forward_full alone, no kernels: 1.9%)
    assert 0 < diff <= 0.03 * scale
    assert int((tri.argmax(-1) == ref.argmax(-1)).sum()) >= 0.9 * len(ref)
    assert float((tri - runs["torch"]).abs().max()) <= 1e-4 * scale    # the two backends read the same cache


def test_runners_run_int8_kv_with_sinks_on_both_backends_and_still_refuse_a_latent_cache(gpt_oss):
    """The attention runners of the tiny GPT-OSS with an int8 cache: the Triton kernel and the torch sink path on
    the same quantized cache agree; MLA with an 8-bit cache stays refused (model and runners)."""
    from dataclasses import replace

    from kernels.model import LlamaModel
    from kernels.runners import make_runners
    from roofline.models import PRESETS

    cfg, _ = gpt_oss
    for phase in ("prefill", "decode"):
        out = {}
        for backend in ("triton", "torch"):
            (r,) = make_runners(cfg, phase, 2, 12, dtype="fp32", backend=backend, kv_dtype="int8",
                                ops=["attention_sliding"])
            assert r.config["kv_cache"].startswith("int8") and r.config["window"] == 8
            out[backend] = (r.config["sinks"], r.fn())
        assert out["triton"][0] == "Triton kernel" and out["torch"][0] == "torch path (kernels.sinks)"
        assert rel_err(out["triton"][1], out["torch"][1].double()) < TOL
    mla = replace(PRESETS["tiny-mla"], n_layers=1)
    from profiler.sweep import SweepPlan

    for build in (lambda: LlamaModel(mla, dtype="fp32", backend="torch", kv_dtype="int8", max_len=4),
                  lambda: make_runners(mla, "decode", 1, 8, dtype="fp32", backend="torch", kv_dtype="int8"),
                  # profile's plan refuses it before anything starts (no progress line, no point)
                  lambda: SweepPlan(mla, batches=(1,), contexts=(8,), kv_dtypes=("fp32", "int8")).validate()):
        with pytest.raises(RooflineError, match="an 8-bit KV cache is not implemented for a latent cache: drop "
                                                "--kv-dtype"):
            build()


# ---------------------------------------------------------------- roofline check

@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_roofline_check_has_passing_int8_kv_rows_with_sinks(backend):
    """The quant part's rows for an 8-bit cache with sinks (``check._kv_sink_checks``): prefill with a window and
    a cached prefix, decode over 3 splits with lengths on both sides of the window; fp32 to ``KERNEL_TOL``."""
    from kernels import check as CK
    from kernels.backend import get_ops

    rows = [r for r in CK._quant_checks(get_ops(backend), torch.float32, torch.device("cpu"), True)
            if "+sinks" in r.name]
    assert [r.name for r in rows] == ["prefill_attn int8 KV +sinks B=2 n=23 p=5 window=8",
                                      "decode_attn int8 KV +sinks lens=[37, 1, 60, 17] window=40"]
    assert all(r.passed and 0 < r.max_rel_err <= r.tol == TOL for r in rows), [str(r) for r in rows]
