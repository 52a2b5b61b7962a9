"""What the compile check launches beyond the runners, per op kind (``kernels.runner_registry.launches``): the
quick set's Llama-shaped extras, each on meta tensors under the recorder (``kernels.variants.record`` calls every
entry once per Llama-2-7B / Llama-3-8B combo).

- norm: the fused residual + RMSNorm (``add_rmsnorm``), which the runners do not time alone;
- attention: non-causal prefill, a chunk after 17 cached tokens (neither 1 nor a multiple of 16: another
  specialisation), sliding windows and softcapping (``ATTENTION_FEATURES``: Mistral, Gemma-2), Llama-4's chunked
  attention (``CHUNK``), GPT-OSS's sinks with and without a window (``SINK_WINDOWS``: the SINKS variants beside
  their no-sink twins); at decode, the verify step of speculative decoding (``verify_launches``:
  ``decode_attention.verify_attention`` with k + 1 queries per sequence, ``VERIFY_KS``, in ``VERIFY_DTYPES`` only,
  plain, with ``VERIFY_FEATURES``, with sinks, and over an int8 cache in bf16: 26 variants per target with
  ``roofline check``'s own);
- linear: a q_proj-shaped linear with a bias (BIAS on; int8 and int4 weights too in the 16-bit dtypes; mxfp4 and
  nvfp4 in bf16: ``kernels.linear_fp4``, ``FP4_DTYPES``);
- activation: GeGLU (Gemma) and ReLU² (Nemotron-H: one input);
- mla_attention: ``kernels.mla.mla_decode`` at DeepSeek-V3's shapes (``MLA_SHAPE``) in the 16-bit dtypes, and in
  bf16 DeepSeek-V3.2's sparse decode over its top-2048 (``kernels.dsa.mla_sparse_decode``, ``DSA_SHAPE``);
- index_scores: DeepSeek-V3.2's indexer scores (64 heads of 128) in bf16, every combo's queries over its keys;
- experts: ``kernels.moe.moe_experts`` at Mixtral-8x7B's and GPT-OSS-20B's shapes (``MOE_SHAPES``), float and
  quantized (``MOE_QUANT``), FP4 in bf16 (``MOE_FP4``: GPT-OSS's own mxfp4, Mixtral's shapes in nvfp4) and fp8
  in bf16 (``MOE_FP8``: GPT-OSS's shapes per channel, Mixtral's in DeepSeek's 128 x 128 blocks; weight-only, the
  e4m3 bytes decoded as integers, so on every target). FP4 is the dequantizing path on every target (sm_80, sm_90,
  and sm_100 too: ``kernels.fp4`` says why); Nemotron-3-Nano's relu2 experts without a gate (``MOE_UNGATED_SHAPES``),
  float;
- FP8 (``fp8_launches``, on targets with fp8 only: ``FP8_CAPABILITY``; sm_80 has none, and the launcher refuses a
  GPU without it in one line): the W8A8 GEMM at a q_proj shape in both scale layouts (per channel with per-token
  activations, 128 x 128 blocks with 1 x 128 groups) with the activation quantization before it, and attention
  over a per-tensor fp8 KV cache (vLLM's; the per-token one is ``kernels.variants.QUANT_PASSES``'), in
  ``FP8_DTYPES`` only (to keep the quick set bounded);
- ssd_scan (Mamba-2, ``mamba_launches``): ``kernels.conv1d`` with its bias and state, the SSD chunked scan from a
  state and from zeros (prefill) or the decode step, and the grouped gated RMSNorm at Nemotron-H's and Falcon-H1's
  shapes (``MAMBA_SHAPES``), at a bounded sample of the quick set's combos (``MAMBA_BATCHES``, ``MAMBA_CONTEXT``).
"""

from __future__ import annotations

import torch

from roofline.formulas import INT4_GROUP

from . import decode_attention as DA
from . import dsa as DSA
from . import geglu as G
from . import linear as L
from . import linear_int4 as L4
from . import linear_fp8 as LF8
from . import linear_int8 as L8
from . import fp4
from . import linear_fp4 as LF4
from . import mla as MLA
from . import moe as MOE
from . import prefill_attention as PA
from . import relu2 as R2
from . import rmsnorm as N
from ._common import dtype_name
from .quant_weight import QuantExperts, QuantWeight
from .runner_registry import launches, needs_capability
from .env import FP8_SM as FP8_CAPABILITY   # the registry's first capability with fp8 tensor cores (89)


# DeepSeek-V3's latent attention (issue 21): 128 heads, kv_lora_rank 512, qk_rope_head_dim 64, the 16-bit dtypes
MLA_SHAPE = dict(n_heads=128, kv_lora_rank=512, rope_dim=64)
MLA_DTYPES = ("bf16", "fp16")


def mla_launches(rec, where, batch, context, dt) -> None:
    """``kernels.mla.mla_decode`` (absorbed decode) on DeepSeek-V3's shapes at the combo's batch and context
    (the Llama runners do not reach it)."""
    meta = torch.device("meta")
    H, R, P = MLA_SHAPE["n_heads"], MLA_SHAPE["kv_lora_rank"], MLA_SHAPE["rope_dim"]
    rec.context = dict(where, op="mla_decode")
    MLA.mla_decode(torch.empty(batch, H, R, dtype=dt, device=meta), torch.empty(batch, H, P, dtype=dt, device=meta),
                   torch.empty(batch, context + 1, R, dtype=dt, device=meta),
                   torch.empty(batch, context + 1, P, dtype=dt, device=meta),
                   torch.empty(batch, dtype=torch.int32, device=meta), torch.arange(batch, device=meta),
                   sm_scale=192 ** -0.5, max_len=context + 1)


# DeepSeek-V3.2's sparse attention (issue 32): the indexer's 64 heads of 128, top-2048; MLA_SHAPE's latent attention;
# bf16 only (a bounded sample: the same kernels in fp16 differ only in the load's dtype)
DSA_SHAPE = dict(index_n_heads=64, index_head_dim=128, topk=2048)
DSA_DTYPES = ("bf16",)


def dsa_launches(rec, where, phase, batch, context, dt) -> None:
    """``kernels.dsa.index_scores`` (decode: one query per sequence over context + 1 keys; prefill: the context's
    queries over it) and, at decode, ``mla_sparse_decode`` over min(topk, context + 1) selected latents."""
    meta = torch.device("meta")
    Hi, Di, topk = DSA_SHAPE["index_n_heads"], DSA_SHAPE["index_head_dim"], DSA_SHAPE["topk"]
    keys = context + (1 if phase == "decode" else 0)
    T = batch if phase == "decode" else batch * context
    rec.context = dict(where, op="index_scores")
    DSA.index_scores(torch.empty(T, Hi, Di, dtype=dt, device=meta), torch.empty(T, Hi, device=meta),
                     torch.empty(batch, keys, Di, dtype=dt, device=meta), torch.empty(T, dtype=torch.long, device=meta),
                     torch.empty(T, dtype=torch.long, device=meta), max_len=keys)
    if phase != "decode":
        return
    H, R, P = MLA_SHAPE["n_heads"], MLA_SHAPE["kv_lora_rank"], MLA_SHAPE["rope_dim"]
    rec.context = dict(where, op="mla_sparse_decode")
    DSA.mla_sparse_decode(torch.empty(batch, H, R, dtype=dt, device=meta), torch.empty(batch, H, P, dtype=dt, device=meta),
                          torch.empty(batch, keys, R, dtype=dt, device=meta),
                          torch.empty(batch, keys, P, dtype=dt, device=meta),
                          torch.empty(batch, min(topk, keys), dtype=torch.int32, device=meta),
                          torch.arange(batch, device=meta), sm_scale=192 ** -0.5)


# The fused MoE expert GEMM (issue 21) at two real shapes: Mixtral-8x7B (H 4096, I 14336, 8 experts, top-2, SwiGLU)
# and GPT-OSS-20B (H 2880, I 2880, 32 experts, top-4, clamped SwiGLU with expert biases). Decode batches give the
# skinny configuration, prefill the tiled one.
MOE_SHAPES = (("mixtral-8x7b", dict(H=4096, I=14336, E=8, k=2, activation="silu", bias=False)),
              ("gpt-oss-20b", dict(H=2880, I=2880, E=32, k=4, activation="swiglu_oai", bias=True)))
# experts without a gate (relu2: the gate-up kernel's GATED false), float only: Nemotron-3-Nano's
MOE_UNGATED_SHAPES = (("nemotron-3-nano", dict(H=2688, I=1856, E=128, k=6)),)


# Quantized experts: (dtypes it runs in, weight dtype, int4 group or None for each shape's own, zero points)
MOE_QUANT = ((("bf16", "fp16"), "int8", None, False), (("bf16", "fp16"), "int4", None, False),
             (("bf16",), "int4", 64, True))
MOE_INT4_GROUP = {"mixtral-8x7b": 128, "gpt-oss-20b": 32}   # the int4 group each shape's K divides (2880 = 90 x 32)
FP4_DTYPES = ("bf16",)                                      # the activation dtype the FP4 variants compile in
MOE_FP4 = {"gpt-oss-20b": "mxfp4", "mixtral-8x7b": "nvfp4"}  # each shape's FP4 format (2880 = 180 x 16, 4096, 14336)
# each shape's fp8 experts (bf16 only: FP4_DTYPES): the two kernel paths, QUANT 5 (per channel; per tensor is the same
# code with a zero scale stride) and QUANT 6 (128 x 128 blocks: 4096 and 14336 are whole blocks)
MOE_FP8 = {"gpt-oss-20b": "fp8", "mixtral-8x7b": "fp8-block"}
MOE_FP8_BATCH = 64   # at this batch only (decode: skinny; prefill: tiled), so the set grows by a handful of variants


def meta_fp4(lead: tuple, K: int, N: int, dt, fmt: str):
    """An FP4 ``QuantWeight`` (``lead`` = ()) or ``QuantExperts`` (``lead`` = (E,)) of [K, N] on the meta device, laid
    out as ``kernels.fp4.quantize`` stores it: uint8 [.., N, K/2], scales [.., N, K/g], nvfp4's fp32 tensor scales."""
    meta, f = torch.device("meta"), fp4.fp4_format(fmt)
    g = f.group_size
    ts = torch.empty(lead, dtype=torch.float32, device=meta) if f.scales.tensor else None
    args = (fmt, torch.empty(*lead, N, K // 2, dtype=torch.uint8, device=meta),
            torch.empty(*lead, N, K // g, dtype=fp4.SCALE_STORAGE[f.scales.dtype], device=meta), None, K, N, g)
    return (QuantExperts if lead else QuantWeight)(*args, tensor_scale=ts, act=dt)


def meta_experts(E: int, K: int, N: int, dt, weight_dtype: str, group_size: int = 0, zero_point: bool = False):
    """``kernels.quant_weight.QuantExperts`` of E [K, N] weights on the meta device, laid out as ``quantize_experts``
    stores them (int8 [E, N, K] + [E, N] scales; int4 [E, N, K/2] + [E, K/g, N] scales and zero points)."""
    meta = torch.device("meta")
    if weight_dtype == "int8":
        return QuantExperts("int8", torch.empty(E, N, K, dtype=torch.int8, device=meta),
                            torch.empty(E, N, dtype=dt, device=meta), None, K, N)
    s = lambda: torch.empty(E, K // group_size, N, dtype=dt, device=meta)  # noqa: E731
    return QuantExperts("int4", torch.empty(E, N, K // 2, dtype=torch.uint8, device=meta), s(),
                        s() if zero_point else None, K, N, group_size)


def moe_launches(rec, where, phase, batch, context, dt) -> None:
    """``kernels.moe.moe_experts`` (both launches) on ``MOE_SHAPES`` at the combo's tokens, then with quantized
    experts (``MOE_QUANT``) in their dtypes; the expert choice is a meta tensor, so the alignment's buffers have
    their largest size (as on a GPU before the step runs)."""
    meta = torch.device("meta")
    T = batch * (context if phase == "prefill" else 1)
    for model, s in MOE_SHAPES:
        E, H, I, k = s["E"], s["H"], s["I"], s["k"]  # noqa: E741
        e = lambda *shape: torch.empty(*shape, dtype=dt, device=meta)  # noqa: E731
        bb = dict(b_gate=e(E, I), b_up=e(E, I), b_down=e(E, H)) if s["bias"] else {}
        route = (torch.empty(T, k, device=meta), torch.empty(T, k, dtype=torch.int64, device=meta))
        rec.context = dict(where, model=model, op="moe_experts")
        MOE.moe_experts(e(T, H), e(E, H, I), e(E, H, I), e(E, I, H), *route, activation=s["activation"], **bb)
        for dts, wd, g, zp in MOE_QUANT:
            if dtype_name(dt) not in dts:
                continue
            g = (g or MOE_INT4_GROUP[model]) if wd == "int4" else 0
            q = [meta_experts(E, K, N, dt, wd, g, zp) for K, N in ((H, I), (H, I), (I, H))]
            rec.context = dict(where, model=model, op=f"moe_experts w={wd}" + (f" g{g}" + (" zp" if zp else "")
                                                                               if g else ""))
            MOE.moe_experts(e(T, H), *q, *route, activation=s["activation"], **bb)
        if dtype_name(dt) in FP4_DTYPES:
            q = [meta_fp4((E,), K, N, dt, MOE_FP4[model]) for K, N in ((H, I), (H, I), (I, H))]
            rec.context = dict(where, model=model, op=f"moe_experts w={MOE_FP4[model]}")
            MOE.moe_experts(e(T, H), *q, *route, activation=s["activation"], **bb)
        if dtype_name(dt) in FP4_DTYPES and batch == MOE_FP8_BATCH:
            q = [meta_fp8_weight(MOE_FP8[model], K, N, (E,)) for K, N in ((H, I), (H, I), (I, H))]
            rec.context = dict(where, model=model, op=f"moe_experts w={MOE_FP8[model]}")
            MOE.moe_experts(e(T, H), *q, *route, activation=s["activation"], **bb)
    for model, s in MOE_UNGATED_SHAPES:
        E, H, I, k = s["E"], s["H"], s["I"], s["k"]  # noqa: E741
        e = lambda *shape: torch.empty(*shape, dtype=dt, device=meta)  # noqa: E731
        route = (torch.empty(T, k, device=meta), torch.empty(T, k, dtype=torch.int64, device=meta))
        rec.context = dict(where, model=model, op="moe_experts relu2")
        MOE.moe_experts(e(T, H), None, e(E, H, I), e(E, I, H), *route, activation="relu2")


WINDOW, SOFTCAP = 4096, 50.0   # Mistral-7B's and Gemma-2's sliding window; Gemma-2's attention softcap
# (window, softcap) beside the plain launch: Mistral (window), Gemma-2 local (both) and global (softcap) layers
ATTENTION_FEATURES = ((WINDOW, None), (WINDOW, SOFTCAP), (None, SOFTCAP))
SINK_WINDOWS = (None, WINDOW)  # GPT-OSS's full and sliding-window layers, with sinks
CHUNK = 8192                   # Llama-4's attention_chunk_size: the CHUNK variants of both attention kernels


def architecture_launches(rec, where, cfg, phase, batch, context, dt, target) -> None:
    """What the Llama runners do not reach but other dense architectures launch (issue 20): attention with a
    sliding window and / or softcapping (WINDOW / SOFTCAP on), a q_proj-shaped linear with a bias (BIAS on;
    int8 and int4 weights too in the 16-bit dtypes), and GeGLU, on ``cfg``'s shapes."""
    attention_feature_launches(rec, where, cfg, phase, batch, context, dt)
    bias_launches(rec, where, cfg, batch * (context if phase == "prefill" else 1), dt)
    geglu_launches(rec, where, cfg, batch * (context if phase == "prefill" else 1), dt)


def attention_feature_launches(rec, where, cfg, phase, batch, context, dt) -> None:
    """Attention with a sliding window and / or softcapping (``ATTENTION_FEATURES``), and chunked (``CHUNK``), on
    ``cfg``'s heads."""
    for window, softcap in ATTENTION_FEATURES:
        rec.context = dict(where, op=f"attention window={window} softcap={softcap}")
        attend_meta(cfg, phase, batch, context, dt, window=window, softcap=softcap)
    rec.context = dict(where, op=f"attention chunk={CHUNK}")
    attend_meta(cfg, phase, batch, context, dt, chunk=CHUNK)


def bias_launches(rec, where, cfg, T, dt) -> None:
    """A q_proj-shaped linear with a bias (BIAS on): float, and int8 / int4 weights in the 16-bit dtypes."""
    meta = torch.device("meta")
    H, N_ = cfg.hidden, cfg.n_heads * cfg.head_dim
    x = torch.empty(T, H, dtype=dt, device=meta)
    bias = torch.empty(N_, dtype=dt, device=meta)
    rec.context = dict(where, op="q_proj bias")
    L.linear(x, torch.empty(H, N_, dtype=dt, device=meta), bias)
    if dt != torch.float32:                                  # the quantized passes' dtypes
        q8 = QuantWeight("int8", torch.empty(N_, H, dtype=torch.int8, device=meta),
                         torch.empty(N_, dtype=dt, device=meta), None, H, N_)
        q4 = QuantWeight("int4", torch.empty(N_, H // 2, dtype=torch.uint8, device=meta),
                         torch.empty(H // INT4_GROUP, N_, dtype=dt, device=meta), None, H, N_, INT4_GROUP)
        rec.context = dict(where, op="q_proj bias w=int8")
        L8.linear_int8(x, q8, bias)
        rec.context = dict(where, op="q_proj bias w=int4")
        L4.linear_int4(x, q4, bias)
    if dtype_name(dt) in FP4_DTYPES:
        for fmt in fp4.FP4:
            rec.context = dict(where, op=f"q_proj bias w={fmt}")
            LF4.linear_fp4(x, meta_fp4((), H, N_, dt, fmt), bias)


def geglu_launches(rec, where, cfg, T, dt) -> None:
    rec.context = dict(where, op="geglu")
    g = torch.empty(T, cfg.intermediate, dtype=dt, device=torch.device("meta"))
    G.geglu(g, g)
    rec.context = dict(where, op="relu2")          # Nemotron-H's ungated MLP: the same flat launch, one input
    R2.relu2(g)


def sink_launches(rec, where, cfg, phase, batch, context, dt) -> None:
    """Attention with sinks (GPT-OSS: one logit per query head, in the model's dtype) on ``cfg``'s shapes, without
    and with a window (``SINK_WINDOWS``), so the quick set compiles the SINKS variants beside their no-sink twins
    (the full set also reaches GPT-OSS's own shapes through its runners). Decode: the merge kernel takes the sink;
    the split kernel is the no-sink one."""
    sinks = torch.empty(cfg.n_heads, dtype=dt, device=torch.device("meta"))
    for window in SINK_WINDOWS:
        rec.context = dict(where, op=f"attention sinks window={window}")
        attend_meta(cfg, phase, batch, context, dt, window=window, sinks=sinks)


def attend_meta(cfg, phase, batch, context, dt, **kw) -> None:
    """One prefill (``context`` new tokens) or decode (``context`` cached + 1) attention launch on ``cfg``'s heads,
    on meta tensors, with the attention keywords ``kw`` (window, softcap, sinks, chunk)."""
    meta = torch.device("meta")
    Hq, Hkv, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    slots = torch.arange(batch, device=meta)
    if phase == "prefill":
        q = torch.empty(batch, context, Hq, D, dtype=dt, device=meta)
        kc = torch.empty(batch, Hkv, context, D, dtype=dt, device=meta)
        PA.prefill_attention(q, kc, kc, slots, 0, **kw)
    else:
        q = torch.empty(batch, Hq, D, dtype=dt, device=meta)
        kc = torch.empty(batch, Hkv, context + 1, D, dtype=dt, device=meta)
        DA.decode_attention(q, kc, kc, torch.empty(batch, dtype=torch.int32, device=meta), slots,
                            max_len=context + 1, **kw)


VERIFY_KS = (3,)                   # drafts per verify step: 4 queries per sequence (the quick set kept small: k = 1
#                                    and 5 change only the scalar row counts, the same tiles)
VERIFY_DTYPES = ("bf16", "fp16")   # a verify step runs in a 16-bit dtype
VERIFY_FEATURES = (dict(window=WINDOW, softcap=SOFTCAP),)   # beside the plain kernel: both masks' constexprs on


def verify_launches(rec, where, cfg, batch, context, dt) -> None:
    """The verify step's attention (``decode_attention.verify_attention``): each of ``batch`` sequences' k + 1
    queries after ``context`` cached keys, for every k of ``VERIFY_KS``, on ``cfg``'s heads; k = 3 also with a
    window and softcapping, with sinks, and (bf16) over an int8 cache."""
    meta = torch.device("meta")
    Hq, Hkv, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    slots, lens = torch.arange(batch, device=meta), torch.empty(batch, dtype=torch.int32, device=meta)
    for k in VERIFY_KS:
        L = context + k + 1
        q = torch.empty(batch, k + 1, Hq, D, dtype=dt, device=meta)
        kc = torch.empty(batch, Hkv, L, D, dtype=dt, device=meta)
        extras = (dict(VERIFY_FEATURES[0]), dict(sinks=torch.empty(Hq, dtype=dt, device=meta))) if k == 3 else ()
        for kw in ({},) + extras:
            rec.context = dict(where, op=f"verify attention k={k}" + "".join(f" {n}" for n in kw))
            DA.verify_attention(q, kc, kc, lens, slots, max_len=L, **kw)
        if k == 3 and dtype_name(dt) == "bf16":         # over an int8 cache with per-token scales (KV_QUANT)
            k8 = torch.empty(batch, Hkv, L, D, dtype=torch.int8, device=meta)
            sc = tuple(torch.empty(batch, Hkv, L, dtype=torch.float32, device=meta) for _ in range(2))
            rec.context = dict(where, op=f"verify attention k={k} kv=int8")
            DA.verify_attention(q, k8, k8, lens, slots, max_len=L, scales=sc)


FP8_GEMMS = ("fp8", "fp8-block")   # the two scale layouts: per channel (x per token), 128 x 128 (x 1 x 128)
FP8_DTYPES = ("bf16",)         # the activation / output dtype the quick set compiles the fp8 kernels in
needs_capability(FP8_CAPABILITY, "_linear_fp8_kernel", "_act_quant_kernel", "e4m3_round")   # sm_80 has no fp8


def fp8_ok(c) -> bool:
    """The combo's target has fp8 and its dtype is one the quick set compiles fp8 in."""
    return c.target.capability >= FP8_CAPABILITY and dtype_name(c.dt) in FP8_DTYPES


def meta_fp8_weight(fmt: str, K: int, N: int, lead: tuple = ()):
    """A [K, N] fp8 ``QuantWeight`` (``lead`` = ()) or ``QuantExperts`` (``lead`` = (E,)) on the meta device, laid out
    as ``kernels.linear_fp8.quantize`` stores it (stacked: a leading E)."""
    meta = torch.device("meta")
    f = LF8.fp8_format(fmt)
    return (QuantExperts if lead else QuantWeight)(
        f.name, torch.empty(*lead, N, K, dtype=LF8.FP8, device=meta),
        torch.empty(*lead, *LF8.scales_shape(f, K, N), dtype=torch.float32, device=meta), None, K, N, f.scales.k)


def fp8_launches(rec, where, cfg, T, dt) -> None:
    """``linear_fp8`` (``act_quant`` then the GEMM) at a q_proj shape of ``cfg`` for ``T`` tokens, per scale layout
    (``FP8_GEMMS``)."""
    H, N_ = cfg.hidden, cfg.n_heads * cfg.head_dim
    x = torch.empty(T, H, dtype=dt, device=torch.device("meta"))
    for fmt in FP8_GEMMS:
        rec.context = dict(where, op=f"q_proj w={fmt} a={LF8.act_format_for(fmt).name}")
        LF8.linear_fp8(x, meta_fp8_weight(fmt, H, N_))


def fp8_kv_launches(rec, where, cfg, phase, batch, context, dt) -> None:
    """Attention over a per-tensor fp8 KV cache (one fp32 scale per layer's K and V) on ``cfg``'s heads."""
    meta = torch.device("meta")
    Hq, Hkv, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    slots, sc = torch.arange(batch, device=meta), tuple(torch.empty(1, device=meta) for _ in range(2))
    L = context + (phase == "decode")
    kc = torch.empty(batch, Hkv, L, D, dtype=LF8.FP8, device=meta)
    rec.context = dict(where, op="attention kv=fp8-tensor")
    if phase == "prefill":
        PA.prefill_attention(torch.empty(batch, context, Hq, D, dtype=dt, device=meta), kc, kc, slots, 0, scales=sc)
    else:
        DA.decode_attention(torch.empty(batch, Hq, D, dtype=dt, device=meta), kc, kc,
                            torch.empty(batch, dtype=torch.int32, device=meta), slots, max_len=L, scales=sc)


# ---- the registry entries: one per op kind, each called once per quick-set combo

@launches("norm")
def _norm(rec, c) -> None:
    x = torch.empty(c.tokens, c.cfg.hidden, dtype=c.dt, device=torch.device("meta"))
    rec.context = dict(c.where, op="add_rmsnorm")
    N.add_rmsnorm(x, x, torch.empty(c.cfg.hidden, dtype=c.dt, device=torch.device("meta")))


@launches("attention")
def _attention(rec, c) -> None:
    cfg, meta, batch, context = c.cfg, torch.device("meta"), c.batch, c.context
    if c.phase == "prefill":      # non-causal, and a chunk after a cached prefix (P = 17)
        q = torch.empty(batch, context, cfg.n_heads, cfg.head_dim, dtype=c.dt, device=meta)
        kc = torch.empty(batch, cfg.n_kv_heads, context, cfg.head_dim, dtype=c.dt, device=meta)
        rec.context = dict(c.where, op="attention non-causal")
        PA.prefill_attention(q, kc, kc, torch.arange(batch, device=meta), 0, causal=False)
        kc = torch.empty(batch, cfg.n_kv_heads, context + 17, cfg.head_dim, dtype=c.dt, device=meta)
        rec.context = dict(c.where, op="attention after 17 cached")
        PA.prefill_attention(q, kc, kc, torch.arange(batch, device=meta), 17)
    attention_feature_launches(rec, c.where, cfg, c.phase, batch, context, c.dt)
    sink_launches(rec, c.where, cfg, c.phase, batch, context, c.dt)
    if c.phase == "decode" and dtype_name(c.dt) in VERIFY_DTYPES:
        verify_launches(rec, c.where, cfg, batch, context, c.dt)
    if fp8_ok(c):
        fp8_kv_launches(rec, c.where, cfg, c.phase, batch, context, c.dt)


@launches("linear")
def _linear(rec, c) -> None:
    bias_launches(rec, c.where, c.cfg, c.tokens, c.dt)
    if fp8_ok(c):
        fp8_launches(rec, c.where, c.cfg, c.tokens, c.dt)


@launches("activation")
def _activation(rec, c) -> None:
    geglu_launches(rec, c.where, c.cfg, c.tokens, c.dt)


@launches("mla_attention")
def _mla_attention(rec, c) -> None:
    if c.phase == "decode" and dtype_name(c.dt) in MLA_DTYPES:
        mla_launches(rec, dict(c.where, model="deepseek-v3"), c.batch, c.context, c.dt)


@launches("index_scores")
def _index_scores(rec, c) -> None:
    if dtype_name(c.dt) in DSA_DTYPES:
        dsa_launches(rec, dict(c.where, model="deepseek-v3.2"), c.phase, c.batch, c.context, c.dt)


@launches("experts")
def _experts(rec, c) -> None:
    moe_launches(rec, c.where, c.phase, c.batch, c.context, c.dt)


# Mamba-2 (issue 32): NemotronHConfig's defaults (Nemotron-H-8B: 128 heads of 64, d_state 128 in 8 groups, chunk 128)
# and Falcon-H1's published shape (8 heads of 128, d_state 128 in one group, chunk 256), conv kernel 4 with its bias,
# at a bounded sample of the quick set's combos (``MAMBA_BATCHES`` and the prefill at ``MAMBA_CONTEXT`` tokens: the
# constexprs depend on neither beyond the conv's token block, 16 from 16 tokens on), Falcon-H1's in
# ``MAMBA_FALCON_DTYPES`` only (its chunk of 256 is the one new constexpr)
MAMBA_SHAPES = (("nemotron-h", dict(H=128, P=64, N=128, G=8, K=4, chunk=128)),
                ("falcon-h1", dict(H=8, P=128, N=128, G=1, K=4, chunk=256)))
MAMBA_BATCHES = (1, 64)
MAMBA_CONTEXT = 1024
MAMBA_FALCON_DTYPES = ("bf16",)


def mamba_launches(rec, where, phase, batch, context, dt) -> None:
    """``kernels.conv1d`` and ``kernels.mamba``'s launchers on meta tensors: the conv over x, B, C with its bias and
    state, the chunked scan from a state (prefill) or the recurrent step (decode), the gated RMSNorm in groups."""
    from . import conv1d as CV
    from . import mamba as MB

    meta, f32 = torch.device("meta"), torch.float32
    e = lambda *s, d=dt: torch.empty(*s, dtype=d, device=meta)  # noqa: E731
    slots = torch.empty(batch, dtype=torch.long, device=meta)
    n = context if phase == "prefill" else 1
    for name, s in MAMBA_SHAPES:
        if name == "falcon-h1" and dtype_name(dt) not in MAMBA_FALCON_DTYPES:
            continue
        H, P, N, G, K = s["H"], s["P"], s["N"], s["G"], s["K"]
        C = H * P + 2 * G * N
        w = dict(where, model=name)
        rec.context = dict(w, op="mamba conv1d")
        CV.causal_conv1d(e(batch, n, C), e(C, K), e(C), e(batch, C, K - 1), slots)
        vec = (e(H), e(H), e(H))
        rec.context = dict(w, op="mamba ssd_scan")
        if phase == "prefill":
            MB.ssd_prefill(e(batch, n, H, P), e(batch, n, H), e(batch, n, G, N), e(batch, n, G, N), *vec,
                           e(batch, H, P, N, d=f32), slots, chunk=s["chunk"], has_state=True)
            MB.ssd_prefill(e(batch, n, H, P), e(batch, n, H), e(batch, n, G, N), e(batch, n, G, N), *vec,
                           e(batch, H, P, N, d=f32), slots, chunk=s["chunk"])
        else:
            MB.ssd_decode(e(batch, H, P), e(batch, H), e(batch, G, N), e(batch, G, N), *vec,
                          e(batch, H, P, N, d=f32), slots)
        rec.context = dict(w, op="mamba gated_norm")
        MB.gated_group_rmsnorm(e(batch * n, H * P), e(batch * n, H * P), e(H * P), G)


@launches("ssd_scan")
def _ssd_scan(rec, c) -> None:
    if c.batch in MAMBA_BATCHES and (c.phase == "decode" or c.context == MAMBA_CONTEXT):
        mamba_launches(rec, c.where, c.phase, c.batch, c.context, c.dt)


# Gated DeltaNet (issue 32): Qwen3NextConfig's defaults (Qwen3-Next-80B-A3B: 16 key, 32 value heads of 128,
# conv kernel 4), at a bounded sample of the quick set's combos (``DELTANET_BATCHES``: the kernels' constexprs do
# not depend on the batch; the conv's token block does on the prefill's length)
DELTANET_SHAPE = dict(k_heads=16, v_heads=32, k_dim=128, v_dim=128, kernel=4)
DELTANET_BATCHES = (1, 64)


def deltanet_launches(rec, where, phase, batch, context, dt) -> None:
    """``kernels.deltanet``'s launchers on meta tensors: the conv with its state, the gates, the chunked rule
    (prefill) or the recurrent step (decode), the gated RMSNorm, and the gated attention's output gate."""
    from . import conv1d as CV
    from . import deltanet as DN

    meta = torch.device("meta")
    e = lambda *s, d=dt: torch.empty(*s, dtype=d, device=meta)  # noqa: E731
    Hk, Hv, dk, dv, K = (DELTANET_SHAPE[k] for k in ("k_heads", "v_heads", "k_dim", "v_dim", "kernel"))
    n = context if phase == "prefill" else 1
    T, C, slots = batch * n, 2 * Hk * dk + Hv * dv, torch.empty(batch, dtype=torch.long, device=meta)
    f32 = torch.float32
    rec.context = dict(where, op="deltanet conv1d")
    CV.causal_conv1d(e(batch, n, C), e(C, K), None, e(batch, C, K - 1), slots)
    rec.context = dict(where, op="deltanet gates")
    DN.delta_gates(e(T, Hv), e(T, Hv), e(Hv), e(Hv))
    rec.context = dict(where, op="deltanet gated_delta")
    if phase == "prefill":
        DN.gated_delta_prefill(e(batch, n, Hk, dk), e(batch, n, Hk, dk), e(batch, n, Hv, dv), e(batch, n, Hv, d=f32),
                               e(batch, n, Hv), e(batch, Hv, dk, dv, d=f32), slots, has_state=True)
        DN.gated_delta_prefill(e(batch, n, Hk, dk), e(batch, n, Hk, dk), e(batch, n, Hv, dv), e(batch, n, Hv, d=f32),
                               e(batch, n, Hv), e(batch, Hv, dk, dv, d=f32), slots)
    else:
        DN.gated_delta_decode(e(batch, Hk, dk), e(batch, Hk, dk), e(batch, Hv, dv), e(batch, Hv, d=f32),
                              e(batch, Hv), e(batch, Hv, dk, dv, d=f32), slots)
    rec.context = dict(where, op="deltanet gated_norm")
    DN.gated_rmsnorm(e(T * Hv, dv), e(T * Hv, dv), e(dv))
    rec.context = dict(where, op="attn_output_gate")
    DN.sigmoid_gate(e(T, 16 * 256), e(T, 16 * 256))          # Qwen3-Next's 16 heads of 256


@launches("gated_delta")
def _gated_delta(rec, c) -> None:
    if c.batch in DELTANET_BATCHES:
        deltanet_launches(rec, c.where, c.phase, c.batch, c.context, c.dt)
