"""Validate every kernel and the model against plain references before anything is timed.

    python -c "from kernels.check import run_checks; [print(r) for r in run_checks()]"
    roofline check --backend triton --dtype bf16

Kernel checks: fresh random inputs (seeded), shapes that are not multiples of the block sizes,
block overrides that force several tiles / splits, outputs poisoned with NaN before the
launch (an element the kernel forgets to write fails). The reference runs in float64 on the
same (dtype-rounded) inputs. Error = max |out - ref| / max |ref| (NaN anywhere -> inf).
Verify attention (``_verify_checks``, speculative decoding's verify step: k + 1 queries per sequence, causal
among them). Architecture checks (``_architecture_checks``): a linear's bias, GeGLU, sliding-window attention (with and
without a cached prefix; decode lengths on both sides of the window) and logit softcapping.
MLA checks (``_mla_checks``): the absorbed MLA decode against its fp64 reference; the naive prefill's torch
path. Gated DeltaNet rows (``kernels.check_deltanet``, group "deltanet"): the chunked rule, the recurrent step, the
conv with its state, the gates, the gated norm and the output gate against transformers' fallbacks.
DSA checks (``_dsa_checks``): the indexer's k_norm, scores and top-k, and the sparse MLA decode.
Model checks (model "tiny", 2 layers, 12 tokens quick): prefill + decode steps equal one
forward_full over the sequence (two slots of different lengths decoded in one batch); chunked prefill equals
unchunked; prefix reuse equals a full prefill; the triton backend equals the torch backend.
With no GPU, kernels/env.py has already switched Triton to its interpreter.

Quantization checks (part "quant", ``_quant_checks``): the int8 and int4 linears, the quantized MoE experts
(``_moe_quant_checks``), the FP4 (mxfp4, nvfp4) linear and experts (``kernels.check_fp4``, added by
``run_checks``; the compile check compiles FP4 at real shapes, ``kernels.compile_launches``) and the 8-bit KV cache (with attention sinks too: ``_kv_sink_checks``) against
dequantized fp64 references (the kernels' arithmetic: ``KERNEL_TOL``), and the linears and kv_append against
the unquantized weights / K and V with a bound derived from the quantization step (``quant_bound``, the
derivation in its docstring); the model with int8 weights and an int8 KV cache equals its own forward_full
and the other backend. ``quality_notes`` is what a user needs before choosing: the
logits of the quantized model against the same seeded model unquantized over a prompt (max
difference, top-1 agreement). fp8 KV checks here (kv_append's fp8 cast) run only on a GPU with fp8.
FP8 rows (with part "quant", ``kernels.check_fp8``): the W8A8 GEMM per tensor / channel / 128x128 blocks, the
activation quantization and attention over fp8 caches (per token and per tensor), also under the interpreter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from roofline.models import load_model

from . import decode_attention as DA
from . import dsa as DSA
from . import embedding as E
from . import geglu as G
from . import kv_append as KV
from . import linear as L
from . import linear_int4 as L4
from . import linear_int8 as L8
from . import mla as MLA
from . import moe as MOE
from . import prefill_attention as PA
from . import relu2 as R2
from . import residual as R
from . import rmsnorm as N
from . import rope as P
from . import sinks as SK
from . import router as RT
from . import swiglu as S
from ._common import HAS_CUDA, dtype_name, torch_dtype
from .backend import get_ops
from . import check_deltanet  # noqa: F401  (registers the Gated DeltaNet rows)
from .check_fp4 import fp4_rows
from . import check_mamba  # noqa: F401  (registers the Mamba-2 rows)
from .check_fp8 import fp8_checks
from .check_result import rel_err, result as _result
from .model import LlamaModel
from .runner_registry import check_groups, checks
from .quant import fp8_supported, prepare_torch, quantize_weight

# Kernel tolerances (relative to max |ref|): fp32 exact up to summation order; fp16 10 bits of
# mantissa; bf16 8 bits (the interpreter also truncates fp32->bf16 instead of rounding).
KERNEL_TOL = {"fp32": 1e-5, "fp16": 2e-3, "bf16": 1.6e-2}
# Model logits pass through every op twice (2 layers) and different kernels (split-K, decode).
MODEL_TOL = {"fp32": 1e-4, "fp16": 1e-2, "bf16": 6e-2}


def _kernel_checks(ops, dt, dev, quick):
    """Yield (name, out, ref, detail) per kernel."""
    g = torch.Generator(device=dev).manual_seed(1234)
    rnd = lambda *s: torch.randn(*s, generator=g, device=dev).to(dt)  # noqa: E731
    nan = lambda *s: torch.full(s, float("nan"), dtype=dt, device=dev)  # noqa: E731
    tri = ops.name == "triton"
    small = dict(block_m=16, block_n=32, block_k=16)

    def run(fn, *args, out=None, **cfg):
        if tri:
            return fn(*args, out=out, **cfg) if out is not None else fn(*args, **cfg)
        return fn(*args)

    dbl = lambda *ts: [t.double() for t in ts]  # noqa: E731
    lin_cases = [(37, 70, 90, small), (3, 200, 300, dict(block_k=32, split_k=3)), (1, 48, 40, {})]
    if not quick:
        lin_cases += [(1000, 1100, 700, {}), (16, 4096, 1000, {})]
    for M, Nn, K, cfg in lin_cases:
        x, w = rnd(M, K), rnd(K, Nn)
        y = run(ops.linear, x, w, out=nan(M, Nn), **(cfg if tri else {}))
        yield f"linear M={M} N={Nn} K={K}", y, L.reference(*dbl(x, w)), ", ".join(f"{k}={v}" for k, v in cfg.items())
    x, r, w = rnd(7, 50), rnd(7, 50), rnd(50)
    yield "rmsnorm T=7 H=50", run(ops.rmsnorm, x, w, 1e-5, out=nan(7, 50)), N.reference(*dbl(x, w)), ""
    h, y = ops.add_rmsnorm(x, r, w, 1e-5, out=(nan(7, 50), nan(7, 50))) if tri else ops.add_rmsnorm(x, r, w)
    hr = x.double() + r.double()
    yield "add_rmsnorm h T=7 H=50", h, hr, ""
    yield "add_rmsnorm y T=7 H=50", y, N.reference(h.double(), w.double()), "norm of h as stored"
    cos, sin = P.rope_tables(40, 12, 10000.0, dev)
    q, k, pos = rnd(5, 6, 12), rnd(5, 3, 12), torch.tensor([0, 3, 7, 39, 2], device=dev)
    qr, kr = P.reference(q.double(), cos, sin, pos), P.reference(k.double(), cos, sin, pos)
    ops.rope(q, k, cos, sin, pos)
    yield "rope q T=5 Hq=6 D=12", q, qr, "positions 0,3,7,39,2"
    yield "rope k T=5 Hkv=3 D=12", k, kr, ""
    gt, up = rnd(3, 1500), rnd(3, 1500)
    yield "swiglu T=3 I=1500", run(ops.swiglu, gt, up, out=nan(3, 1500)), S.reference(*dbl(gt, up)), ""
    yield "residual_add T=3 H=1500", run(ops.residual_add, gt, up, out=nan(3, 1500)), R.reference(*dbl(gt, up)), ""
    tab, ids = rnd(30, 20), torch.tensor([3, 29, 0, 3], device=dev)
    yield "embedding T=4 H=20", run(ops.embedding, ids, tab, out=nan(4, 20)), E.reference(ids, tab.double()), ""
    kc, vc = nan(3, 2, 10, 12), nan(3, 2, 10, 12)
    kk, vv = rnd(4, 2, 12), rnd(4, 2, 12)
    sl, ps = torch.tensor([0, 2, 2, 1], device=dev), torch.tensor([9, 0, 1, 5], device=dev)
    kc2, vc2 = kc.double(), vc.double()
    ops.kv_append(kk, vv, kc, vc, sl, ps)
    KV.reference(kk.double(), vv.double(), kc2, vc2, sl, ps)
    written = ~torch.isnan(kc2)
    same_holes = torch.equal(torch.isnan(kc), ~written) and torch.equal(torch.isnan(vc), ~written)
    kv_out = torch.stack([kc[written], vc[written]]) if same_holes else kc
    yield "kv_append T=4 Hkv=2 D=12", kv_out, torch.stack([kc2[written], vc2[written]]), "other cache rows untouched"
    acfg = dict(block_m=16, block_n=16) if tri else {}
    for B, n, Hq, Hkv, D, p, causal in [(2, 37, 4, 2, 16, 0, True), (1, 21, 4, 1, 24, 13, True),
                                        (2, 19, 2, 2, 16, 5, False)]:
        kc, vc, q = rnd(3, Hkv, 64, D), rnd(3, Hkv, 64, D), rnd(B, n, Hq, D)
        slots = torch.tensor([2, 0][:B], device=dev)
        o = ops.prefill_attention(q, kc, vc, slots, p, causal=causal, **(dict(acfg, out=nan(B, n, Hq, D))
                                                                           if tri else {}))
        ref = PA.reference(*dbl(q, kc, vc), slots, p, causal=causal)
        yield (f"prefill_attn B={B} n={n} p={p} Hq/Hkv={Hq}/{Hkv} D={D}" + ("" if causal else " noncausal"),
               o, ref, ", ".join(f"{k}={v}" for k, v in acfg.items()))
    for Hq, Hkv, D, lens, cfg in [(4, 2, 16, [37, 1, 0, 60], dict(block_n=16)),      # length 0: zeros
                                  (8, 1, 24, [50, 13], dict(block_n=16, splits=3)), (2, 2, 16, [5], {})]:
        B = len(lens)
        kc, vc, q = rnd(4, Hkv, 64, D), rnd(4, Hkv, 64, D), rnd(B, Hq, D)
        slots, ln = torch.tensor([3, 0, 1, 2][:B], device=dev), torch.tensor(lens, device=dev)
        o = ops.decode_attention(q, kc, vc, ln, slots, **(dict(cfg, out=nan(B, Hq, D)) if tri else {}))
        yield (f"decode_attn lens={lens} Hq/Hkv={Hq}/{Hkv} D={D}", o, DA.reference(*dbl(q, kc, vc), ln, slots),
               ", ".join(f"{k}={v}" for k, v in cfg.items()))
    yield from _verify_checks(ops, dev, rnd, nan, tri)
    yield from _architecture_checks(ops, dev, rnd, nan, tri)
    yield from _mla_checks(ops, dev, rnd, nan, tri, quick)
    yield from _moe_checks(ops, dev, rnd, nan, tri, quick)
    yield from _dsa_checks(ops, dev, rnd, nan, tri, quick)    # last: the draws before it stay as they were


# (T = k + 1 queries, Hq, Hkv, D, lengths, config, keywords): ragged lengths (one of exactly T: the queries alone),
# several key tiles and splits, 96 (query, head) rows (two row blocks of 64), a window and softcapping, sinks
VERIFY_CASES = [(4, 4, 2, 16, [37, 4, 60], dict(block_n=16, splits=3), {}),
                (2, 8, 1, 24, [50, 13], dict(block_n=16), {}),
                (6, 32, 2, 16, [41], dict(block_n=16, splits=2), {}),
                (4, 4, 2, 16, [45, 9], dict(block_n=16, splits=2), dict(window=10, softcap=5.0)),
                (3, 4, 4, 16, [30, 17], dict(block_n=16), dict(sinks=True))]


def _verify_checks(ops, dev, rnd, nan, tri):
    """Verify attention (issue 34: speculative decoding's verify step): T queries per sequence, the last T of its
    keys, causal among them, against ``decode_attention.verify_reference`` (an off-by-one mask among the T moves
    every row but the last by far more than the tolerance: tests/test_verify_attention.py)."""
    for T, Hq, Hkv, D, lens, cfg, kw in VERIFY_CASES:
        B = len(lens)
        kc, vc, q = rnd(4, Hkv, 64, D), rnd(4, Hkv, 64, D), rnd(B, T, Hq, D)
        slots, ln = torch.tensor([3, 0, 1][:B], device=dev), torch.tensor(lens, device=dev)
        akw = dict(kw, sinks=rnd(Hq)) if "sinks" in kw else dict(kw)
        o = ops.verify_attention(q, kc, vc, ln, slots, **akw, **(dict(cfg, out=nan(B, T, Hq, D)) if tri else {}))
        rkw = dict(akw, sinks=akw["sinks"].double()) if "sinks" in akw else akw
        what = "".join(f" {k}" + ("" if k == "sinks" else f"={v}") for k, v in kw.items())
        yield (f"verify_attn T={T} lens={lens} Hq/Hkv={Hq}/{Hkv} D={D}{what}", o,
               DA.verify_reference(q.double(), kc.double(), vc.double(), ln, slots, **rkw),
               ", ".join(f"{k}={v}" for k, v in cfg.items()) if tri else "")


def _mla_checks(ops, dev, rnd, nan, tri, quick):
    """MLA (issue 21): the absorbed decode over a latent cache (DeepSeek-V3's rank 512 / rope 64 shrunk to
    32 / 16; ragged lengths, a length of 1 and of 0, head counts that are not powers of two, two head blocks,
    forced splits; the real 512 / 64 with 128 heads in the full set) and the naive prefill's torch path."""
    cases = [(5, 32, 16, [37, 1, 0, 60], dict(block_n=16)), (20, 32, 16, [50, 13], dict(block_n=16, splits=3)),
             (3, 24, 8, [1], {})]
    if not quick:
        cases += [(128, 512, 64, [1000, 1, 4097], {})]
    for H, Rk, Pr, lens, cfg in cases:
        B, L = len(lens), max(64, max(lens))
        ql, qp, ckv, kpe = rnd(B, H, Rk), rnd(B, H, Pr), rnd(4, L, Rk), rnd(4, L, Pr)
        slots, ln = torch.tensor([3, 0, 1, 2][:B], device=dev), torch.tensor(lens, device=dev)
        scale = (Rk // 4 + Pr) ** -0.5
        o = ops.mla_decode(ql, qp, ckv, kpe, ln, slots, sm_scale=scale, **(dict(cfg, out=nan(B, H, Rk)) if tri else {}))
        ref = MLA.reference(ql.double(), qp.double(), ckv.double(), kpe.double(), ln, slots, sm_scale=scale)
        yield f"mla_decode lens={lens} H={H} R={Rk} P={Pr}", o, ref, ", ".join(f"{k}={v}" for k, v in cfg.items() if tri)
    for B, n, cached, H, QK, V in [(2, 9, 0, 3, 24, 12), (1, 7, 5, 5, 24, 16)]:
        q, k, v = rnd(B, n, H, QK), rnd(B, cached + n, H, QK), rnd(B, cached + n, H, V)
        o = ops.mla_prefill(q, k, v, sm_scale=QK ** -0.5, cached=cached)
        ref = MLA.mla_prefill_reference(q.double(), k.double(), v.double(), sm_scale=QK ** -0.5, cached=cached)
        yield f"mla_prefill B={B} n={n} p={cached} H={H} qk={QK} v={V}", o, ref, "torch path (SDPA)"

def _dsa_checks(ops, dev, rnd, nan, tri, quick):
    """DeepSeek Sparse Attention (issue 32, ``kernels.dsa``): the indexer's k_norm (LayerNorm with its bias); its
    scores (8 heads padded to 16, Di 24 padded to 32, rows seeing 1, 13, every and no key, two
    slots, 16-key blocks) against fp64 with the -inf pattern compared; the top-k selection from them against the
    fp64 scores' (sorted indices: one wrong key fails the row); the head weights matter (a row with w shifted
    by 1% of its size fails the scores row: ``test_dsa_kernels``); the sparse absorbed decode over selections
    with -1 holes and an empty one, two head blocks and 3 splits (DeepSeek-V3.2's 128 heads, rank 512, top-2048
    of 4,097 in the full set)."""
    dbl = lambda *ts: [t.double() for t in ts]  # noqa: E731
    x, lw, lb = rnd(5, 24), rnd(24), rnd(24)
    ref = (x.double() - x.double().mean(-1, keepdim=True)) / (x.double().var(-1, unbiased=False, keepdim=True)
                                                              + 1e-6).sqrt() * lw.double() + lb.double()
    yield "layernorm T=5 D=24", ops.layernorm(x, lw, lb, 1e-6), ref, "torch layer_norm (both backends)"
    T, Hi, Di, L, topk = 5, 8, 24, 70, 6
    q, w, kc = rnd(T, Hi, Di), rnd(T, Hi).float(), rnd(3, L, Di)
    slots, lim = torch.tensor([2, 0, 1, 2, 0], device=dev), torch.tensor([1, 13, 70, 65, 0], device=dev)
    sc = ops.index_scores(q, w, kc, slots, lim, max_len=L, **({"block_n": 16} if tri else {}))
    sref = DSA.scores_reference(*dbl(q, w, kc), slots, lim, max_len=L).double()
    fin = torch.isfinite(sref)
    yield (f"index_scores T={T} Hi={Hi} Di={Di} limits={lim.tolist()}",
           sc[fin] if torch.equal(torch.isfinite(sc), fin) else sc, sref[fin], "block_n=16" if tri else "")
    sel, want = DSA.index_topk(sc, topk), DSA.index_topk(sref.float(), topk)
    yield (f"index_topk T={T} k={topk}", sel.sort(-1).values.double(), want.sort(-1).values.double(),
           "torch.topk of the kernel's scores vs the fp64 scores'")
    cases = [(20, 32, 16, 64, [[3, 5, -1, 0, 60, 2], [-1] * 6, [1, 2, 3, 4, 5, 6]], dict(block_n=16, splits=3))]
    if not quick:
        g = torch.Generator().manual_seed(5)
        cases += [(128, 512, 64, 4097, [torch.randperm(4097, generator=g)[:2048].tolist()], {})]
    for H, Rk, Pr, L, idx, cfg in cases:
        B = len(idx)
        ql, qp, ckv, kpe = rnd(B, H, Rk), rnd(B, H, Pr), rnd(4, L, Rk), rnd(4, L, Pr)
        ix, sl = torch.tensor(idx, dtype=torch.int32, device=dev), torch.tensor([3, 0, 1][:B], device=dev)
        scale = (Rk // 4 + Pr) ** -0.5
        o = ops.mla_sparse_decode(ql, qp, ckv, kpe, ix, sl, sm_scale=scale, **(dict(cfg, out=nan(B, H, Rk))
                                                                                if tri else {}))
        ref = DSA.sparse_reference(*dbl(ql, qp, ckv, kpe), ix, sl, sm_scale=scale)
        yield (f"mla_sparse_decode B={B} K={ix.shape[1]} H={H} R={Rk} P={Pr}", o, ref,
               ", ".join(f"{k}={v}" for k, v in cfg.items() if tri))


def _architecture_checks(ops, dev, rnd, nan, tri):
    """What other dense architectures add (issue 20): a linear's bias (Qwen2), GeGLU (Gemma), sliding-window
    attention (Mistral, Gemma-2/3) with and without a cached prefix and decode lengths on both sides of the
    window, Gemma-2's logit softcapping and Llama-4's chunked attention. Yields (name, out, ref, detail) like ``_kernel_checks``."""
    dbl = lambda *ts: [t.double() for t in ts]  # noqa: E731
    cfgs = lambda c: ", ".join(f"{k}={v}" for k, v in c.items()) if tri else ""  # noqa: E731
    for M, Nn, K, cfg in [(37, 70, 90, dict(block_m=16, block_n=32, block_k=16)), (3, 200, 300,
                                                                                    dict(block_k=32, split_k=3))]:
        x, w, b = rnd(M, K), rnd(K, Nn), rnd(Nn)
        y = ops.linear(x, w, b, out=nan(M, Nn), **cfg) if tri else ops.linear(x, w, b)
        yield f"linear+bias M={M} N={Nn} K={K}", y, L.reference(*dbl(x, w, b)), cfgs(cfg)
    gt, up = rnd(3, 1500), rnd(3, 1500)
    yield "geglu T=3 I=1500", ops.geglu(gt, up, out=nan(3, 1500)) if tri else ops.geglu(gt, up), \
        G.reference(*dbl(gt, up)), "gelu(tanh) x up"
    yield "relu2 T=3 I=1500", ops.relu2(up, out=nan(3, 1500)) if tri else ops.relu2(up), R2.reference(*dbl(up)), \
        "relu(x)^2 (Nemotron-H)"
    acfg = dict(block_m=16, block_n=16) if tri else {}
    for B, n, p, W, cap in [(2, 37, 0, 5, None), (1, 23, 29, 20, None), (1, 30, 10, 25, None),
                            (2, 19, 5, None, 3.0), (1, 41, 13, 9, 2.5)]:
        kc, vc, q = rnd(3, 2, 80, 16), rnd(3, 2, 80, 16), rnd(B, n, 4, 16)
        slots = torch.tensor([2, 0][:B], device=dev)
        kw = dict(window=W, softcap=cap)
        o = ops.prefill_attention(q, kc, vc, slots, p, **kw, **(dict(acfg, out=nan(B, n, 4, 16)) if tri else {}))
        what = (f" window={W}" if W else "") + (f" softcap={cap}" if cap else "")
        yield f"prefill_attn B={B} n={n} p={p}{what}", o, PA.reference(*dbl(q, kc, vc), slots, p, **kw), cfgs(acfg)
    for lens, W, cap, cfg in [([3, 40, 0, 17], 16, None, dict(block_n=16, splits=3)),
                              ([50, 13], 7, None, dict(block_n=16)), ([45, 9], 20, 2.0, dict(block_n=16))]:
        B = len(lens)
        kc, vc, q = rnd(4, 2, 64, 16), rnd(4, 2, 64, 16), rnd(B, 4, 16)
        slots, ln = torch.tensor([3, 0, 1, 2][:B], device=dev), torch.tensor(lens, device=dev)
        kw = dict(window=W, softcap=cap)
        o = ops.decode_attention(q, kc, vc, ln, slots, **kw, **(dict(cfg, out=nan(B, 4, 16)) if tri else {}))
        what = f" window={W}" + (f" softcap={cap}" if cap else "")
        yield f"decode_attn lens={lens}{what}", o, DA.reference(*dbl(q, kc, vc), ln, slots, **kw), cfgs(cfg)
    # Llama-4's chunked local attention: prefill from a chunk's middle across chunk starts, decode on both sides
    for B, n, p, C in [(2, 37, 0, 8), (1, 30, 13, 6)]:
        kc, vc, q = rnd(3, 2, 80, 16), rnd(3, 2, 80, 16), rnd(B, n, 4, 16)
        slots = torch.tensor([2, 0][:B], device=dev)
        o = ops.prefill_attention(q, kc, vc, slots, p, chunk=C, **(dict(acfg, out=nan(B, n, 4, 16)) if tri else {}))
        yield f"prefill_attn B={B} n={n} p={p} chunk={C}", o, PA.reference(*dbl(q, kc, vc), slots, p, chunk=C), \
            cfgs(acfg)
    lens, cfg = [3, 40, 17, 33], dict(block_n=16, splits=3)
    kc, vc, q = rnd(4, 2, 64, 16), rnd(4, 2, 64, 16), rnd(4, 4, 16)
    slots, ln = torch.tensor([3, 0, 1, 2], device=dev), torch.tensor(lens, device=dev)
    o = ops.decode_attention(q, kc, vc, ln, slots, chunk=16, **(dict(cfg, out=nan(4, 4, 16)) if tri else {}))
    yield f"decode_attn lens={lens} chunk=16", o, DA.reference(*dbl(q, kc, vc), ln, slots, chunk=16), cfgs(cfg)


def _moe_checks(ops, dev, rnd, nan, tri, quick):
    """Mixture of experts (issue 21): ``route`` of each kind against a plain fp64 reimplementation (weights
    compared per expert; a different expert set is inf), and the fused expert GEMM against the fp64 expert loop
    with uneven loads (expert 0 favoured), an expert with no tokens, T=1 and T=37, both activations, biases.
    Yields (name, out, ref, detail) like ``_kernel_checks``."""
    for kind, kw in (("softmax_topk", {}), ("topk_softmax", {}), ("sigmoid_topk", {}),
                     ("sigmoid_group", dict(n_group=4, topk_group=2, scale=2.5, bias=rnd(16).float() * 0.2)),
                     ("softmax_topk", dict(bias=rnd(16).float() * 0.05))):          # ERNIE's correction bias
        logits = rnd(37, 16)
        w, ids = ops.route(logits, 4, kind=kind, **kw)
        w_ref, ids_ref = RT.reference(logits, 4, kind=kind, **kw)
        out, ref = _by_expert(w, ids), _by_expert(w_ref, ids_ref)
        label = f"route {kind}{' + bias' if 'bias' in kw and kind == 'softmax_topk' else ''} T=37 E=16 k=4"
        yield label, out if torch.equal(ids.sort(-1).values, ids_ref.sort(-1).values) \
            else torch.full_like(out, float("nan")), ref, "weights per chosen expert vs fp64"
    cases = [(37, 6, 2, 40, 24, "silu", False, dict(block_m=16, block_n=16, block_k=16)),
             (37, 6, 2, 40, 24, "swiglu_oai", True, dict(block_m=16, block_n=16, block_k=16)),
             (1, 8, 2, 64, 48, "silu", False, {}), (5, 4, 3, 48, 40, "swiglu_oai", True, {}),
             (40, 2, 1, 40, 24, "silu", False, {}),      # tiled: 40 rows on one expert
             (37, 6, 2, 40, 24, "relu2", False, dict(block_m=16, block_n=16, block_k=16)),   # no gate (Nemotron-H)
             (5, 4, 3, 48, 40, "relu2", True, {})]
    if not quick:
        cases += [(300, 8, 2, 256, 128, "silu", False, {}), (16, 8, 2, 512, 256, "swiglu_oai", True, {})]
    for T, E, k, H, I, act, bias, cfg in cases:  # noqa: E741
        logits = rnd(T, E).float()
        logits[:, 0] += 2.0                                                  # expert 0 takes most tokens
        logits[:, E - 1] = -1e9                                              # expert E-1 takes none
        w, ids = RT.route(logits, k, kind="softmax_topk")
        ungated = act in MOE.UNGATED                                         # up -> relu2 -> down: no gate
        args = (rnd(T, H), None if ungated else rnd(E, H, I) * 0.3, rnd(E, H, I) * 0.3, rnd(E, I, H) * 0.3, w, ids)
        bb = dict(b_gate=rnd(E, I), b_up=rnd(E, I), b_down=rnd(E, H)) if bias else {}
        if ungated:
            bb.pop("b_gate", None)
        y = ops.moe_experts(*args, activation=act, **bb, **(dict(cfg, out=nan(T, H)) if tri else {}))
        ref = MOE.reference(*[a.double() if a is not None and a.is_floating_point() else a for a in args],
                            activation=act, compute_dtype=torch.float64, **{n: b.double() for n, b in bb.items()})
        how = MOE.moe_config(T, E, k, H, I, args[0].dtype, dev, **cfg)["kind"] if tri else "expert loop"
        yield (f"moe_experts T={T} E={E} k={k} {act}" + (" +bias" if bias else ""), y, ref,
               f"{how}; expert 0 loaded, expert {E - 1} empty" + (", " + ", ".join(f"{a}={v}" for a, v in cfg.items())
                                                                 if tri and cfg else ""))


def _by_expert(w, ids):
    """Routing weights [T, k] reordered by expert id per token (an unsorted top-k may order them otherwise)."""
    return w.double().gather(1, ids.sort(dim=-1).indices)


def _model_checks(backend, dt, dev, quick, model="tiny"):
    """The model (a preset, or a checkpoint folder: its real weights) against itself: prefill+decode =
    forward_full, chunked = unchunked, prefix reuse = full prefill, one backend = the other."""
    cfg = model if not isinstance(model, str) else load_model(model)
    make = lambda be=backend: LlamaModel(cfg, dtype=dt, backend=be, device=dev, seed=7, max_slots=4,  # noqa: E731
                                         max_len=64)
    g = torch.Generator().manual_seed(99)
    S, S2, steps = (12, 8, 3) if quick else (40, 25, 8)
    p1, p2 = S - steps, S2 - steps
    toks = torch.randint(0, cfg.vocab, (1, S), generator=g).to(dev)
    other = torch.randint(0, cfg.vocab, (1, S2), generator=g).to(dev)
    m = make()
    full = m.forward_full(toks)                                         # [S, vocab]
    full_o = m.forward_full(other)
    # prefill two prompts of different lengths in slots 0 and 1, then decode both in one batch
    out, ref = [m.prefill(toks[0, :p1], 0), m.prefill(other[0, :p2], 1)], [full[p1 - 1], full_o[p2 - 1]]
    for i in range(steps):
        lg = m.decode_step(torch.stack([toks[0, p1 + i], other[0, p2 + i]]), torch.tensor([0, 1]))
        out += [lg[0], lg[1]]
        ref += [full[p1 + i], full_o[p2 + i]]
    yield ("model prefill+decode = forward_full", torch.stack(out), torch.stack(ref),
           f"2 slots, lengths {p1} and {p2}, {steps} steps")
    m2 = make()
    c1, c2 = S // 4, S // 3
    m2.prefill(toks[0, :c1], 2), m2.prefill(toks[0, c1:c1 + c2], 2)
    chunked = m2.prefill(toks[0, c1 + c2:], 2)
    whole = m2.prefill(toks[0], 3)
    yield "model chunked prefill = unchunked", chunked, whole, f"chunks {c1}+{c2}+{S - c1 - c2} vs {S}"
    reuse = S // 2 + 1
    src = 3
    if cfg.linear_layers or cfg.mamba_layers:   # a DeltaNet / Mamba-2 state is kept at a slot's end: reuse a whole
                                                # cached prompt
        src = 0
        m2.prefill(toks[0, :reuse], src, logits=False)
    reused = m2.prefill_with_prefix(toks[0], 1, src, reuse)
    yield "model prefix reuse = full prefill", reused, whole, f"{reuse} of {S} tokens reused"
    other_be = "torch" if backend == "triton" else "triton"
    yield f"model {backend} = {other_be} backend", make(other_be).forward_full(toks), full, "forward_full logits"


# ---------------------------------------------------------------- quantization

def quant_bound(x: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """The largest |y - x @ w| weight-only quantization can cause: 0.5 x sum_k |x[m, k]| x step[k, n].

    Derivation: round to nearest puts every dequantized weight within half a step of the weight,
    |w[k, n] - dq[k, n]| <= step[k, n] / 2, with step = the scale of (k, n) (int8: s[n], its output
    channel's; int4: s[k // g, n], its group's; a zero point shifts values, not steps). Then
    |sum_k x[m, k] (w - dq)[k, n]| <= sum_k |x[m, k]| step[k, n] / 2 by the triangle inequality:
    a bound that holds for every input, not a statistical one. (Rounding errors of random data add
    like a random walk, so typical errors are ~sqrt(K) times smaller.) x [M, K], step [K, N] -> [M, N].
    """
    return 0.5 * (x.double().abs() @ step.double())


def _bound_err(y, y_full, bound, slack) -> float:
    """max |y - y_full| / (bound + slack): <= 1 passes. ``slack`` covers the kernel's own arithmetic."""
    y, y_full = y.double(), y_full.double()
    if y.shape != y_full.shape or not torch.isfinite(y).all():
        return math.inf
    return float(((y - y_full).abs() / (bound + slack)).max())


def _quant_checks(ops, dt, dev, quick):
    """Yield CheckResults of the quantized kernels (see the module docstring)."""
    g = torch.Generator(device=dev).manual_seed(4321)
    rnd = lambda *s: torch.randn(*s, generator=g, device=dev).to(dt)  # noqa: E731
    nan = lambda *s: torch.full(s, float("nan"), dtype=dt, device=dev)  # noqa: E731
    tri = ops.name == "triton"
    dname = dtype_name(dt)
    tol = KERNEL_TOL[dname]
    small = dict(block_m=16, block_n=32, block_k=32)
    cases = [(37, 70, 128, small), (3, 200, 256, dict(block_k=32, split_k=3)), (1, 48, 64, {})]
    if not quick:
        cases += [(1000, 1100, 768, {}), (16, 4096, 1024, {})]
    kinds = [("int8", {}), ("int4", dict(group_size=32)), ("int4", dict(group_size=64, zero_point=True))]
    for M, Nn, K, cfg in cases:
        x, w = rnd(M, K), rnd(K, Nn)
        y_full = x.double() @ w.double()                                  # the unquantized layer
        for kind, qkw in kinds:
            qw = quantize_weight(w, kind, **qkw)
            if not tri:
                prepare_torch(qw)
            y = ops.linear(x, qw, out=nan(M, Nn), **cfg) if tri else ops.linear(x, qw)
            mod = L8 if kind == "int8" else L4
            zp = " zp" if qkw.get("zero_point") else ""
            label = kind + (f" g{qkw['group_size']}{zp}" if kind == "int4" else "")
            how = ", ".join(f"{k}={v}" for k, v in cfg.items()) if tri else qw.torch_impl.split(":")[0]
            ref = mod.reference(x.double(), qw)
            yield _result(f"linear_{label} M={M} N={Nn} K={K}", rel_err(y, ref), tol, f"vs dequantized; {how}")
            step = _steps(qw)
            err = _bound_err(y, y_full, quant_bound(x, step), tol * y_full.abs().max())
            yield _result(f"linear_{label} M={M} N={Nn} K={K} vs {dname} w", err, 1.0,
                          "error / (quantization bound + arithmetic)")
    yield from _moe_quant_checks(ops, dev, rnd, nan, tri, tol)
    yield from _kv_quant_checks(ops, dt, dev, g, tri, tol)


# (T, E, k, H, I, activation, bias, kinds): GPT-OSS-like skinny (T k = 10 rows <= 16 per expert: decode) with the
# clamped SwiGLU, biases, int8 and int4 g32 (MXFP4's block), I = 96 not a multiple of BLOCK_N (64); Mixtral-like
# tiled (80 rows > 16 x 4: prefill) with SiLU, int8, int4 g128 and int4 g64 with zero points (2 and 4 groups along
# K). The launchers' own configs, as on a GPU: the bf16 launches are the compile check's MoE variants (MOE_QUANT at
# GPT-OSS's and Mixtral's shapes), so replaying these (variants.check_launches) adds next to no compilations.
MOE_QUANT_CASES = ((5, 4, 2, 64, 96, "swiglu_oai", True, (("int8", {}), ("int4", dict(group_size=32)))),
                   (40, 4, 2, 128, 256, "silu", False, (("int8", {}), ("int4", dict(group_size=128)),
                                                        ("int4", dict(group_size=64, zero_point=True)))))


def _moe_quant_checks(ops, dev, rnd, nan, tri, tol):
    """Quantized experts (``kernels.quant_weight.QuantExperts``: int8 per channel, int4 group-wise with and without zero
    points; ``MOE_QUANT_CASES``) through ``moe_experts`` (the Triton kernels' QUANT path; the torch backend's
    per-expert quantized GEMMs)
    against the fp64 expert loop over the dequantized weights (``moe.reference``), expert 0 loaded and expert E-1
    empty as in ``_moe_checks``; the kernels' arithmetic, so ``KERNEL_TOL``."""
    from .quant import quantize_experts

    for T, E, k, H, I, act, bias, kinds in MOE_QUANT_CASES:  # noqa: E741
        logits = rnd(T, E).float()
        logits[:, 0] += 2.0                                                  # expert 0 takes most tokens
        logits[:, E - 1] = -1e9                                              # expert E-1 takes none
        w, ids = RT.route(logits, k, kind="softmax_topk")
        x, wts = rnd(T, H), (rnd(E, H, I) * H ** -0.5, rnd(E, H, I) * H ** -0.5, rnd(E, I, H) * I ** -0.5)
        bb = dict(b_gate=rnd(E, I) * 0.1, b_up=rnd(E, I) * 0.1, b_down=rnd(E, H) * 0.1) if bias else {}
        for kind, qkw in kinds:
            q = [quantize_experts(t, kind, **qkw) for t in wts]
            y = ops.moe_experts(x, *q, w, ids, activation=act, **bb, **(dict(out=nan(T, H)) if tri else {}))
            ref = MOE.reference(x.double(), *q, w.double(), ids, activation=act, compute_dtype=torch.float64,
                                **{n: b.double() for n, b in bb.items()})
            label = kind + (f" g{qkw['group_size']}" + (" zp" if qkw.get("zero_point") else "") if qkw else "")
            c = MOE.moe_config(T, E, k, H, I, x.dtype, dev, group_size=qkw.get("group_size", 0))
            how = (f"{c['kind']}, block_k={c['block_k']}" if tri else f"per expert: {q[0].torch_impl}")
            yield _result(f"moe_experts {label} T={T} E={E} k={k} {act}" + (" +bias" if bias else ""),
                          rel_err(y, ref), tol, f"vs dequantized; {how}")


def _steps(qw) -> torch.Tensor:
    """[K, N]: the quantization step (scale) of every weight."""
    if qw.dtype == "int8":
        return qw.scales.double()[None, :].expand(qw.in_features, -1)
    return qw.scales.double().repeat_interleave(qw.group_size, dim=0)


def _kv_quant_checks(ops, dt, dev, g, tri, tol):
    rnd = lambda *s: torch.randn(*s, generator=g, device=dev).to(dt)  # noqa: E731
    nan = lambda *s: torch.full(s, float("nan"), dtype=dt, device=dev)  # noqa: E731
    from .quant import KV_TORCH, quantize_kv_rows

    kinds = ["int8"] + (["fp8"] if dev.type == "cuda" and fp8_supported(dev) else [])
    for kind in kinds:
        # kv_append: every written row within its quantization bound; other rows and scales untouched
        sentinel = 77 if kind == "int8" else 3.0
        kc = torch.full((3, 2, 10, 12), sentinel, device=dev).to(KV_TORCH[kind])
        vc = kc.clone()
        ks, vs = (torch.full((3, 2, 10), float("nan"), device=dev) for _ in range(2))
        kk, vv = rnd(4, 2, 12), rnd(4, 2, 12)
        sl, ps = torch.tensor([0, 2, 2, 1], device=dev), torch.tensor([9, 0, 1, 5], device=dev)
        ops.kv_append(kk, vv, kc, vc, sl, ps, scales=(ks, vs))
        errs, untouched = [], True
        written = torch.zeros(3, 2, 10, dtype=torch.bool, device=dev)
        written[sl, :, ps] = True
        for x, c, sc in ((kk, kc, ks), (vv, vc, vs)):
            c = c.double()                                                           # fp8: index its values
            s = sc[sl, :, ps].double()                                               # [T, Hkv]
            deq = c[sl, :, ps] * s[..., None]
            xd = x.double()
            eps = 2.0 ** -23 * 4 * xd.abs()                                          # fp32 arithmetic of the scale
            if kind == "int8":
                bound = 0.5 * s[..., None] + eps                                     # half a step
            else:                                                                    # e4m3: 3 mantissa bits
                bound = 2.0 ** -4 * xd.abs() + 2.0 ** -10 * s[..., None] + eps
            errs.append(float(((deq - xd).abs() / bound).max()) if torch.isfinite(deq).all() else math.inf)
            untouched &= bool(torch.isnan(sc[~written]).all()) and bool((c[~written] == sentinel).all())
        err = max(errs) if untouched else math.inf
        yield _result(f"kv_append {kind} T=4 Hkv=2 D=12", err, 1.0, "error / half a quantization step; other rows "
                      "untouched" if kind == "int8" else "error / e4m3 rounding bound; other rows untouched")
        # attention over an 8-bit cache vs the reference over the dequantized cache (fp64)
        kc, vc = (quantize_kv_rows(torch.randn(4, 2, 64, 16, generator=g, device=dev), kind) for _ in range(2))
        (kq, ksc), (vq, vsc) = kc, vc
        sc = (ksc, vsc)
        acfg = dict(block_m=16, block_n=16) if tri else {}
        for B, n, Hq, p, causal in [(2, 37, 4, 0, True), (1, 21, 4, 13, True), (2, 19, 2, 5, False)]:
            q = rnd(B, n, Hq, 16)
            slots = torch.tensor([2, 0][:B], device=dev)
            kw = dict(acfg, out=nan(B, n, Hq, 16)) if tri else {}
            o = ops.prefill_attention(q, kq, vq, slots, p, causal=causal, scales=sc, **kw)
            ref = PA.reference(q.double(), kq, vq, slots, p, causal=causal, scales=sc)
            yield _result(f"prefill_attn {kind} KV B={B} n={n} p={p}" + ("" if causal else " noncausal"),
                          rel_err(o, ref), tol, "vs dequantized K/V")
        for Hq, lens, cfg in [(4, [37, 1, 0, 60], dict(block_n=16)), (8, [50, 13], dict(block_n=16, splits=3))]:
            B = len(lens)
            q = rnd(B, Hq, 16)
            slots, ln = torch.tensor([3, 0, 1, 2][:B], device=dev), torch.tensor(lens, device=dev)
            kw = dict(cfg, out=nan(B, Hq, 16)) if tri else {}
            o = ops.decode_attention(q, kq, vq, ln, slots, scales=sc, **kw)
            yield _result(f"decode_attn {kind} KV lens={lens} Hq={Hq}", rel_err(o, DA.reference(
                q.double(), kq, vq, ln, slots, scales=sc)), tol, "vs dequantized K/V")
        yield from _kv_sink_checks(ops, dev, rnd, nan, tri, tol, kind, kq, vq, sc)
        q, slots, ln = rnd(3, 4, 4, 16), torch.tensor([3, 0, 1], device=dev), torch.tensor([37, 4, 60], device=dev)
        kw = dict(block_n=16, splits=3, out=nan(3, 4, 4, 16)) if tri else {}
        o = ops.verify_attention(q, kq, vq, ln, slots, scales=sc, **kw)                # the verify step, 8-bit KV
        yield _result(f"verify_attn {kind} KV T=4 lens=[37, 4, 60]", rel_err(o, DA.verify_reference(
            q.double(), kq, vq, ln, slots, scales=sc)), tol, "vs dequantized K/V")


def _kv_sink_checks(ops, dev, rnd, nan, tri, tol, kind, kq, vq, sc):
    """Attention sinks (GPT-OSS) over the 8-bit cache with a window: the Triton kernels with SINKS and KV_QUANT
    together (the torch backend: ``kernels.sinks``, dequantizing), against ``kernels.sinks`` in fp64 over the
    dequantized cache. Large, small and neutral sinks per head."""
    kd, vd = (KV.dequantized(c, s, torch.float64) for c, s in ((kq, sc[0]), (vq, sc[1])))
    sinks = torch.tensor([4.0, -4.0, 0.5, 0.0], device=dev)
    q, slots = rnd(2, 23, 4, 16), torch.tensor([2, 0], device=dev)
    kw = dict(window=8, sinks=sinks, scales=sc)
    o = (ops.prefill_attention(q, kq, vq, slots, 5, block_m=16, block_n=16, out=nan(2, 23, 4, 16), **kw) if tri
         else SK.prefill_with_sinks(q, kq, vq, slots, 5, **kw))
    ref = SK.prefill_with_sinks(q.double(), kd, vd, slots, 5, window=8, sinks=sinks.double())
    yield _result(f"prefill_attn {kind} KV +sinks B=2 n=23 p=5 window=8", rel_err(o, ref), tol,
                  "vs kernels.sinks on dequantized K/V" + (", block_m=16, block_n=16" if tri else ""))
    lens = [37, 1, 60, 17]
    q, slots, ln = rnd(4, 4, 16), torch.tensor([3, 0, 1, 2], device=dev), torch.tensor(lens, device=dev)
    kw = dict(window=40, sinks=sinks, scales=sc)           # 40 keys over 3 splits; lengths on both sides of 40
    o = (ops.decode_attention(q, kq, vq, ln, slots, block_n=16, splits=3, out=nan(4, 4, 16), **kw) if tri
         else SK.decode_with_sinks(q, kq, vq, ln, slots, **kw))
    ref = SK.decode_with_sinks(q.double(), kd, vd, ln, slots, window=40, sinks=sinks.double())
    yield _result(f"decode_attn {kind} KV +sinks lens={lens} window=40", rel_err(o, ref), tol,
                  "vs kernels.sinks on dequantized K/V" + (", block_n=16, splits=3" if tri else ""))


def _quant_model_checks(backend, dt, dev, quick):
    """The model with int8 weights and an int8 KV cache: prefill+decode = forward_full, and = the other backend."""
    cfg = load_model("tiny")
    kw = dict(dtype=dt, device=dev, seed=7, max_slots=2, max_len=64, weight_dtype="int8", kv_dtype="int8")
    g = torch.Generator().manual_seed(98)
    S, steps = (12, 3) if quick else (40, 8)
    toks = torch.randint(0, cfg.vocab, (1, S), generator=g).to(dev)
    m = LlamaModel(cfg, backend=backend, **kw)
    full = m.forward_full(toks)
    p = S - steps
    out = [m.prefill(toks[0, :p], 0)] + [m.decode_step(toks[0, p + i][None], torch.tensor([0]))[0]
                                         for i in range(steps)]
    yield "model int8 w+KV prefill+decode = forward_full", torch.stack(out), full[p - 1:S], f"{steps} decode steps"
    other = "torch" if backend == "triton" else "triton"
    yield (f"model int8 w+KV {backend} = {other} backend", LlamaModel(cfg, backend=other, **kw).forward_full(toks),
           full, "forward_full logits")


@dataclass(frozen=True)
class QualityNote:
    """What quantization does to a model's output: its logits against the same seeded model unquantized."""

    name: str            # "int8 weights"
    model: str
    dtype: str           # the unquantized model's dtype
    tokens: int          # prompt positions compared
    max_abs_diff: float  # max |logit - logit_ref| over positions and vocabulary
    logit_scale: float   # max |logit_ref| (what the difference is measured against)
    top1: int            # positions whose argmax agrees

    @property
    def top1_share(self) -> float:
        return self.top1 / self.tokens if self.tokens else math.nan

    def __str__(self):
        rel = self.max_abs_diff / self.logit_scale if self.logit_scale else math.nan
        return (f"note {self.name} vs {self.dtype} ({self.model}, random weights, {self.tokens}-token prompt): "
                f"max |logit difference| {self.max_abs_diff:.3g} ({rel:.1%} of the largest logit "
                f"{self.logit_scale:.3g}); top-1 agreement {self.top1}/{self.tokens} ({self.top1_share:.0%})")

    def to_dict(self) -> dict:
        return dict(name=self.name, model=self.model, dtype=self.dtype, tokens=self.tokens,
                    max_abs_diff=self.max_abs_diff, logit_scale=self.logit_scale, top1=self.top1)


QUALITY_CASES = (("int8 weights", dict(weight_dtype="int8")), ("int8 KV cache", dict(kv_dtype="int8")),
                 ("int4 weights (g128)", dict(weight_dtype="int4")),
                 ("int4 weights (g32, zero points)", dict(weight_dtype="int4", group_size=32, zero_point=True)))


def quality_notes(dtype="fp32", device=None, *, backend=None, model="small", tokens=32, cases=QUALITY_CASES) -> list:
    """``QualityNote`` per quantization in ``cases``: logits of the quantized ``model`` against the unquantized one
    over a ``tokens``-token prompt (forward_full). Quantization, not the kernels, sets these numbers, so on a CPU
    the torch backend computes them (the interpreter would take minutes); ``backend`` overrides. NB: random
    Gaussian weights have no outliers, so these say how the formats round, not how a trained model degrades."""
    dt = torch_dtype(dtype)
    dev = torch.device(device or ("cuda" if HAS_CUDA else "cpu"))
    be = backend or ("triton" if dev.type == "cuda" else "torch")
    cfg = load_model(model)
    toks = torch.randint(0, cfg.vocab, (1, tokens), generator=torch.Generator().manual_seed(5)).to(dev)
    kw = dict(dtype=dt, backend=be, device=dev, seed=0, max_slots=1, max_len=tokens)
    ref = LlamaModel(cfg, **kw).forward_full(toks).double()
    out = []
    for name, qkw in cases:
        q = LlamaModel(cfg, **kw, **qkw).forward_full(toks).double()
        out.append(QualityNote(name, cfg.name, dtype_name(dt), tokens, float((q - ref).abs().max()),
                               float(ref.abs().max()), int((q.argmax(-1) == ref.argmax(-1)).sum())))
    return out


def run_checks(backend="triton", dtype="fp32", device=None, quick=True, *,
               parts=("kernels", "model", "quant"), model="tiny") -> list:
    """Every kernel and the model against their references; returns CheckResults (never raises on a miss).

    ``quick``: small shapes (the only sensible choice under the interpreter); ``quick=False`` adds
    larger shapes with the default (GPU) block sizes and longer model sequences. ``parts``: "kernels",
    "model", "quant" (the quantized kernels and model, ``_quant_checks``). ``model``: the model checks' model
    (a preset or a Hugging Face folder, with its real weights when it holds *.safetensors).
    """
    dt = torch_dtype(dtype)
    dev = torch.device(device or ("cuda" if HAS_CUDA else "cpu"))
    ops = get_ops(backend)
    return [r for g in check_groups(parts) for r in g.rows(ops, dt, dev, quick, model)]


# The groups of rows, registered by the op kinds they check (kernels.runner_registry: the same registry the runners
# and the compile check's launches are in). Kinds no group names (scale, gate, latent_append, index_append: a
# multiply, a sigmoid-gated sum, two copies) run only inside the model and are checked through the transformers
# parity tests.
_ROW_KINDS = ("embedding", "norm", "linear", "rope", "kv_append", "attention", "residual", "activation", "softcap",
              "mla_attention", "mla_up", "router", "experts", "layernorm", "index_scores", "index_topk")


def _judged(rows, tol, dt):
    return [_result(name, rel_err(out, ref), tol[dtype_name(dt)], detail) for name, out, ref, detail in rows]


@checks("kernels", "kernels", _ROW_KINDS, order=10)
def _kernel_rows(ops, dt, dev, quick, model):
    return _judged(_kernel_checks(ops, dt, dev, quick), KERNEL_TOL, dt)


@checks("model", "model", _ROW_KINDS, order=10)
def _model_rows(ops, dt, dev, quick, model):
    return _judged(_model_checks(ops.name, dt, dev, quick, model), MODEL_TOL, dt)


@checks("quantized", "quant", ("linear", "experts", "kv_append", "attention"), order=10)
def _quant_rows(ops, dt, dev, quick, model):
    return list(_quant_checks(ops, dt, dev, quick))


@checks("fp8", "quant", ("linear", "experts", "attention"), order=20)
def _fp8_rows(ops, dt, dev, quick, model):
    return fp8_checks(ops, dt, dev, quick)     # kernels.check_fp8: the FP8 GEMM, act quant, fp8 KV


@checks("fp4", "quant", ("linear", "experts"), order=30)
def _fp4_rows(ops, dt, dev, quick, model):
    return [_result(n, rel_err(o, r), t, d) for n, o, r, t, d in fp4_rows(ops, dt, dev)]


@checks("quantized model", "quant", ("linear", "kv_append"), order=40)
def _quant_model_rows(ops, dt, dev, quick, model):
    return _judged(_quant_model_checks(ops.name, dt, dev, quick), MODEL_TOL, dt)
