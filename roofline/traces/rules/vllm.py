"""Trace cost rules for vLLM's ops and the kernels it runs (names and argument layouts from vLLM's sources:
``csrc/torch_bindings.cpp``, ``vllm/model_executor/layers/fused_moe``, ``vllm/v1/attention/backends``; the shared
attention and MoE helpers here serve ``rules.sglang`` too).

Ops, from their recorded shapes:

* Quantized GEMMs: ``_C::cutlass_scaled_mm(out [M,N], a [M,K] fp8, b [K,N] fp8, a_scales, b_scales, bias)``
  (the weight's format from its scales' shape: [1] per tensor, [N] per channel, [K/128, N/128] blocks),
  ``_C::cutlass_scaled_fp4_mm(out, a [M,K/2], b [N,K/2], a_sf, b_sf, alpha)`` (NVFP4), Marlin
  ``_C::gptq_marlin_gemm`` / Machete ``_C::machete_mm`` (a [M,K], int4 weight, group scales [K/g, N]) ->
  ``formulas.gemm`` with the weight's bytes as ``roofline.precision.formats`` stores it, and the activations'
  recorded scales.
* Quantize kernels: ``_C::static_scaled_fp8_quant`` / ``dynamic_scaled_fp8_quant`` /
  ``dynamic_per_token_scaled_fp8_quant`` (out, input, scale, ...), ``_C::per_token_group_fp8_quant(input,
  output_q, output_s, group, ...)`` -> ``formulas.elementwise`` (input read, fp8 written; 1 FLOP per element
  static, 2 dynamic: the abs-max and the scale) + the scales written.
* vLLM's custom all-reduce (``_C_custom_ar::all_reduce``, ``vllm::all_reduce``) and symmetric-memory all-reduces
  (``symm_mem::*all_reduce*``): communication, the message its input.

Kernels (``kernels=``), for kernels whose op no rule costs:

* Fused MoE, category "moe": vLLM's ``fused_moe_kernel`` (twice per layer: gate+up, then down), triton_kernels'
  ``_matmul_ogs_*`` / ``_p_matmul_ogs_*`` (``..._swiglu``: gate+up; else down), DeepGEMM's grouped GEMMs,
  CUTLASS grouped MoE, TRT-LLM-gen ``bmm_*E2m1*`` -> ``formulas.moe_expert_launches`` (the launches of
  ``formulas.moe_experts``). Experts, widths and top-k from the op's weights and ``topk_ids`` where recorded
  (``vllm::outplace_fused_experts(hidden, w1 [E,2I,H], w2 [E,H,I], topk_weights, topk_ids [T,k])``), else from
  ``--model``; tokens from the op's hidden states, else the engine step's; tokens per expert uniform over the
  top-k (``expected_distinct_experts``), said in the note; the experts' bytes as ``--model``'s precision (or the
  kernel name's format: ``mxfp4``, ``fp8``) stores them. The top-k kernels (``topkGatingSoftmax``,
  ``_topk_forward``, ``grouped_topk``) -> ``formulas.routing``; the routing's sort and alignment kernels are
  uncosted ("moe").
* Paged attention, category "attention": FlashAttention (``flash_fwd*``, ``FlashAttnFwd*``), vLLM's unified /
  paged / Triton attention (``kernel_unified_attention_*``, ``paged_attention_v1/v2``), FlashInfer's batch
  prefill / decode -> ``StepMix.attention`` of the engine step (``roofline.traces.engine_steps``): each chunk
  over its prefix, each decode over its context, the layer's window (the launch's place in the step) from
  ``--model``; FlashMLA and CUTLASS MLA -> ``StepMix.mla_attention``. No step mix, no cost. Split-KV combine
  kernels are uncosted (their splits are not recorded).
"""

from __future__ import annotations

import re

from ... import formulas as F
from ...cost import Cost
from ...dtypes import bytes_per_element
from ...precision.formats import act_format, weight_bytes, weight_format
from ..opcost import numel, signature
from ..registry import rule

# ----------------------------------------------------------------------------------------------- quantized GEMMs
def _fp8_weight_format(scales, k: int, n: int) -> str:
    """The fp8 weight format a recorded weight-scale shape says: one scale per tensor, per channel, or blocks."""
    if scales is None or numel(scales[0]) == 1:
        return "fp8-tensor"
    s = scales[0]
    if len(s) == 2 and s[0] > 1 and s[1] > 1:
        return "fp8-block"
    return "fp8"


def quant_gemm(a, x, out_dtype: str, x_scales, w_format: str, k: int, n: int, bias=None):
    """x [M, K] (quantized or not) times a K x N weight stored in ``w_format``: ``formulas.gemm`` with the weight's
    bytes as stored (its scales included) + the activations' recorded scales + a bias. It runs at fp8 when both
    are fp8 (W8A8), else in the output's dtype (the weight dequantized)."""
    m = numel(x[0][:-1])
    fmt = weight_format(w_format)
    out_dtype = out_dtype or "bf16"
    cost = F.gemm(m, k, n, a_dtype=x[1], out_dtype=out_dtype, b_bytes=weight_bytes(fmt, k, n, out_dtype),
                  bias=numel(bias[0]) if bias else 0, bias_dtype=bias[1] if bias else None)
    if x_scales is not None:
        cost = cost + Cost(0, numel(x_scales[0]) * bytes_per_element(x_scales[1]))
    compute = "fp8" if fmt.compute == "fp8" and x[1] == "fp8" else out_dtype
    return a.op(cost, compute, signature(x[0], (k, n), dtype=f"{x[1]}x{fmt.name}->{out_dtype}"),
                detail={"m": m, "k": k, "n": n, "batch": 1, "weight_format": fmt.name})


@rule("_C::cutlass_scaled_mm", category="gemm", tensor_cores=True)
def cutlass_scaled_mm(a):        # (out [M,N], a [M,K], b [K,N], a_scales, b_scales, bias)
    out, x, w, xs, ws, bias = (a.tensor(i) for i in range(6))
    k, n = w[0][0], w[0][1]
    if x[0][-1] != k:
        return None
    return quant_gemm(a, x, out[1], xs, _fp8_weight_format(ws, k, n), k, n, bias)


@rule("_C::cutlass_scaled_fp4_mm", category="gemm", tensor_cores=True)
def cutlass_scaled_fp4_mm(a):    # (out [M,N], a [M,K/2] packed e2m1, b [N,K/2], a_sf, b_sf, alpha)
    out, x, w = a.tensor(0), a.tensor(1), a.tensor(2)
    k, n = 2 * x[0][-1], w[0][0]
    m = numel(x[0][:-1])
    fmt = weight_format("nvfp4")
    g = F.gemm(m, k, n, a_dtype="uint8", out_dtype=out[1], b_bytes=weight_bytes(fmt, k, n, out[1]))
    # the activations as the registry's NVFP4 stores them (e2m1, an e4m3 scale per 16, the tensor scale), for the
    # one byte per element gemm counted for them
    cost = Cost(g.flops, g.bytes - m * k + weight_bytes(act_format("nvfp4"), k, m, out[1]))
    return a.op(cost, "fp4", signature((m, k), (k, n), dtype=f"nvfp4xnvfp4->{out[1]}"),
                detail={"m": m, "k": k, "n": n, "batch": 1, "weight_format": "nvfp4"})


@rule(("vllm::w8a8_block_fp8_matmul_deepgemm", "sglang::deep_gemm_fp8_fp8_bf16_nt"), category="gemm",
      tensor_cores=True)
def deepgemm_fp8(a):             # vLLM (A [M,K], B [N,K], As, Bs, block_size, dtype); SGLang (A, As, B, Bs, C)
    t = a.tensor
    x, w, xs = (t(0), t(1), t(2)) if a.name.startswith("vllm") else (t(0), t(2), t(1))
    k, n = x[0][-1], w[0][0]
    if w[0][1] != k:
        return None
    return quant_gemm(a, x, "bf16", xs, "fp8-block", k, n)


@rule(kernels=r"_w8a8_block_fp8_matmul|fp8_gemm_nt|sm90_fp8_gemm_1d|sm100_fp8_gemm_1d", category="gemm",
      tensor_cores=True, priority=9)
def block_fp8_gemm_kernel(a):
    """A dense 128x128-block fp8 GEMM kernel (DeepGEMM's, vLLM's Triton fallback) under an op no rule costs
    (``vllm::apply_w8a8_block_fp8_linear(input [M,K], weight [N,K] fp8, ...)``): the activations quantized to
    fp8 in 1 x 128 groups (the registry's ``fp8-group``), the weight in ``fp8-block``."""
    ts = a.tensors()
    x = next(t for t in ts if len(t[0]) >= 2 and t[1] in ("bf16", "fp16", "fp8"))
    k = x[0][-1]
    w = next(t for t in ts if len(t[0]) == 2 and t[1] == "fp8" and t[0][1] == k and t is not x)
    g = act_format("fp8-group").scales.k
    rows = numel(x[0][:-1])
    return quant_gemm(a, (x[0], "fp8"), "bf16", ((rows, -(-k // g)), "fp32"), "fp8-block", k, w[0][0])


def _int4_group_gemm(a, x, scales):
    """Marlin / Machete: x [M, K] times an int4 weight with group scales [K/g, N] (``weight_format('int4', g)``)."""
    k, groups, n = x[0][-1], scales[0][0], scales[0][1]
    fmt = weight_format("int4", k // groups)
    m = numel(x[0][:-1])
    cost = F.gemm(m, k, n, a_dtype=x[1], b_bytes=weight_bytes(fmt, k, n, x[1]))
    return a.op(cost, x[1], signature(x[0], (k, n), dtype=f"{x[1]}x{fmt.name}"),
                detail={"m": m, "k": k, "n": n, "batch": 1, "weight_format": fmt.describe()})


@rule("_C::gptq_marlin_gemm", category="gemm", tensor_cores=True)
def marlin(a):                   # (a [M,K], c?, b_q_weight, b_scales [K/g, N], ...): the first 2-D float scales
    x = a.tensor(0)
    scales = next((t for t in a.tensors()[1:] if len(t[0]) == 2 and t[1] in ("fp16", "bf16") and t[0][-1] > 1
                   and t[0] != x[0]), None)
    return _int4_group_gemm(a, x, scales)


@rule("_C::machete_mm", category="gemm", tensor_cores=True)
def machete(a):                  # (a [M,K], b_q, b_type, out_type, b_group_scales [K/g, N], ...)
    x = a.tensor(0)
    scales = next(t for t in a.tensors()[2:] if len(t[0]) == 2 and t[1] in ("fp16", "bf16"))
    return _int4_group_gemm(a, x, scales)


# ----------------------------------------------------------------------------------------------- quantize kernels
def quantize(a, x, q, scales, dynamic: bool):
    """x read, its fp8 copy written (``formulas.elementwise``: 1 FLOP per element static, 2 dynamic), + scales."""
    n = numel(x[0])
    cost = F.elementwise(n, ((n, x[1]),), out_dtype="fp8", flops_per_element=2 if dynamic else 1)
    if scales is not None and dynamic:
        cost = cost + Cost(0, numel(scales[0]) * bytes_per_element(scales[1]))
    return a.op(cost, x[1], signature(x[0], dtype=f"{x[1]}->fp8"), detail={"elements": n})


@rule(("_C::static_scaled_fp8_quant", "_C::dynamic_scaled_fp8_quant", "_C::dynamic_per_token_scaled_fp8_quant"),
      category="quantize")
def scaled_fp8_quant(a):         # (out [.., K] fp8, input, scale, [scale_ub])
    return quantize(a, a.tensor(1), a.tensor(0), a.tensor(2), a.base != "static_scaled_fp8_quant")


@rule(("_C::per_token_group_fp8_quant", "sgl_kernel::sgl_per_token_group_quant_fp8",
       "sgl_kernel::sgl_per_token_quant_fp8"), category="quantize")
def per_token_group_quant(a):    # (input, output_q, output_s, [group_size, eps, fp8_min, fp8_max, ...])
    return quantize(a, a.tensor(0), a.tensor(1), a.tensor(2), True)


@rule(kernels=r"_per_token_group_quant_fp8|per_token_group_quant_8bit|scaled_fp8_quant_kernel|"
              r"per_token_quant_fp8", category="quantize", priority=10)
def quant_kernel(a):
    """A Triton / CUDA quantize kernel under an op no rule costs: the op's input (under a fused MoE op, its first
    launch quantizes the hidden states [T, H], its second the activations [T*k, I]); the scales per 1 x 128 group
    (the registry's ``fp8-group`` activations) when the name says group, else per row."""
    ts = a.tensors()
    if a.name in MOE_OPS:
        three = [t for t in ts if len(t[0]) == 3]
        ids = next(t for t in ts if len(t[0]) == 2 and t[1] in ("int32", "int64"))
        x = ts[0] if a.nth_in_op == 0 else ((ids[0][0] * ids[0][1], three[1][0][2]), ts[0][1])
    else:
        x = next((t for t in ts if t[1] in ("bf16", "fp16", "fp32") and len(t[0]) >= 2), None)
    if x is None:
        return None
    rows, cols = numel(x[0][:-1]), x[0][-1]
    g = act_format("fp8-group").scales.k if "group" in a.low else cols
    return quantize(a, x, None, ((rows, -(-cols // g)), "fp32"), True)


@rule(pattern=r"^_C_cache_ops::concat_and_cache_mla$", category="kv_write")
def concat_and_cache_mla(a):     # (kv_c [T, rank], k_pe [T, rope], kv_cache [.., rank + rope], slots, dtype, scale)
    c, pe, cache = a.tensor(0), a.tensor(1), a.tensor(2)
    kv = "fp8" if "fp8" in str(a.value(4)).lower() else cache[1]
    n = numel(c[0]) + numel(pe[0])
    return a.op(F.copy(n, src_dtype=c[1], dst_dtype=kv), c[1], signature(c[0], pe[0], dtype=f"{c[1]}->{kv}"))


# ----------------------------------------------------------------------------------------------- communication
@rule(pattern=r"^(?:_C_custom_ar::all_reduce|vllm::all_reduce|symm_mem::.*all_reduce)", category="communication",
      shapes=True)
def custom_all_reduce(a):        # (fa, inp, out, ...) / (inp, group_name) / symm_mem (input, reduce_op, group)
    x = next((t for t in a.tensors() if t[0]), None)
    if x is None:
        return None
    msg = numel(x[0]) * bytes_per_element(x[1])
    return a.op(Cost(0, 0), x[1], f"allreduce {numel(x[0])} x {x[1]}",
                detail={"collective": "allreduce", "group_size": None, "message_bytes": msg})


# ----------------------------------------------------------------------------------------------- fused MoE
MOE_OPS = ("vllm::outplace_fused_experts", "vllm::inplace_fused_experts", "sglang::outplace_fused_experts",
           "sglang::inplace_fused_experts")


def _experts_op(model):
    from ...layer import op_spec, precision_of      # the model's own experts op and its precision
    return op_spec(model, "experts"), precision_of(model)


def _format_in_name(low: str):
    for tag, fmt in (("mxfp4", "mxfp4"), ("e2m1", "mxfp4"), ("nvfp4", "nvfp4"), ("fp8", "fp8-block")):
        if tag in low:
            return weight_format(fmt)
    return None


def moe_compute(low: str, fmt) -> str:
    """The rate a fused-MoE launch runs at: the weight's low-precision rate when its activations are in the same
    format (triton_kernels names its dtypes out x act x weight: ``bf16xbf16xmxfp4`` dequantizes into bf16;
    ``bmm_E2m1E2m1``: fp4 x fp4; vLLM's fp8 ``fused_moe_kernel`` quantizes its activations: W8A8), else bf16."""
    m = re.search(r"_([a-z0-9]+)x([a-z0-9]+)x([a-z0-9]+)_\d", low)
    if m is not None:
        act = m.group(2)
        return "fp4" if act in ("mxfp4", "nvfp4", "e2m1") else "fp8" if act.startswith("fp8") else "bf16"
    if "e2m1e2m1" in low:
        return "fp4"
    return "fp8" if fmt.compute == "fp8" and "bfloat16" not in low else "bf16"


def moe_launch(a, gate_up: bool):
    """One launch of a fused MoE (the module docstring): ``formulas.moe_expert_launches``' gate+up or down."""
    m = a.model
    act = "bf16"
    w1 = w2 = ids = None
    if a.name in MOE_OPS:
        ts = a.tensors()
        three = [t for t in ts if len(t[0]) == 3]
        w1, w2 = (three + [None, None])[:2]
        ids = next((t for t in ts if len(t[0]) == 2 and t[1] in ("int32", "int64")), None)
    if w1 is not None and w2 is not None and ids is not None:
        E, H, I, k = w1[0][0], w1[0][2], w2[0][2], ids[0][1]
        T = ids[0][0]
        fmt = _format_in_name(a.low) or (weight_format("fp8-block") if w1[1] == "fp8" else weight_format(act))
        activation, bias, how = (m.expert_activation, m.expert_bias, "the op's weights") if m else ("silu", False,
                                                                                                   "the op's weights")
        gu = 2 * weight_bytes(fmt, H, I, act) + (2 * I * 2 if bias else 0)
        dn = weight_bytes(fmt, I, H, act) + (H * 2 if bias else 0)
    else:
        if m is None or not m.n_experts:
            return None
        E, H, k = m.n_experts, m.hidden, m.n_active
        I = m.moe_intermediate // a.tp
        x = next((t for t in a.tensors() if len(t[0]) == 2 and t[0][-1] == H and t[1] in ("bf16", "fp16")), None)
        T = x[0][0] if x is not None else (a.step.tokens if a.step is not None else None)
        if not T:
            return None
        op, prec = _experts_op(m)
        fmt = _format_in_name(a.low)
        if fmt is None:
            gu = 2 * prec.weight_bytes(op, H, I, act)
            dn = prec.weight_bytes(op, I, H, act)
            fmt = prec.weight_format(op, act)
        else:
            gu, dn = 2 * weight_bytes(fmt, H, I, act), weight_bytes(fmt, I, H, act)
        gu += 2 * I * 2 if m.expert_bias else 0
        dn += H * 2 if m.expert_bias else 0
        activation, bias = m.expert_activation, m.expert_bias
        how = "--model" + (" and the op's hidden states" if x is not None else " and the engine step's tokens")
    up, down = F.moe_expert_launches(T, H, I, E, k, gate_up_bytes=gu, down_bytes=dn, activation=activation,
                                     bias=bias, act_dtype=act)
    part = "gate+up" if gate_up else "down"
    return a.op(up if gate_up else down, moe_compute(a.low, fmt),
                f"{part} T{T} E{E} top{k} H{H} I{I} {fmt.name}",
                f"tokens per expert: uniform routing over the top-{k} (sizes from {how})",
                {"tokens": T, "n_experts": E, "k": k, "hidden": H, "intermediate": I, "launch": part,
                 "weight_format": fmt.name})


@rule(kernels=r"_matmul_ogs", category="moe", tensor_cores=True, priority=10)
def matmul_ogs(a):               # triton_kernels: the first launch fuses the activation (..._swiglu)
    return moe_launch(a, "swiglu" in a.low)


@rule(kernels=r"fused_moe_kernel|fused_moe_.*kernel|m_grouped.*gemm|grouped_gemm|cutlass_moe|moe_gemm|"
              r"grouped_mm|bmm_.*e2m1", category="moe", tensor_cores=True, priority=10)
def fused_moe(a):                # two launches per layer under one op (or one step): even gate+up, odd down
    return moe_launch(a, (a.nth_in_op if a.name else a.nth) % 2 == 0)


@rule(kernels=r"topkgatingsoftmax|topk_softmax|_topk_forward|grouped_topk|biased_grouped_topk", category="moe",
      priority=10)
def moe_topk(a):
    m = a.model
    ts = [t for t in a.tensors() if len(t[0]) == 2 and t[1] in ("bf16", "fp16", "fp32")]
    T = ts[0][0][0] if ts else (a.step.tokens if a.step is not None else None)
    if m is None or not m.n_experts or not T:
        return None
    c = F.routing(T, m.n_experts, m.n_active, kind=m.router, renorm=m.norm_topk, n_group=m.n_group,
                  score_bias=m.router_correction, logits_dtype=ts[0][1] if ts else "bf16")
    return a.op(c, "fp32", f"T{T} E{m.n_experts} top{m.n_active} {m.router}", detail={"tokens": T})


@rule(kernels=r"moe_align_block_size|count_and_sort_expert|_combined_routing|_sum_bitmatrix|_routing_|"
              r"moe_sum|_finalize_matmul", category="moe", priority=10)
def moe_bookkeeping(a):          # sorting and aligning the routed rows: their sizes are tensor values
    return None


# ----------------------------------------------------------------------------------------------- paged attention
ATTENTION_KERNELS = (r"flash_fwd(?!.*(?:combine|mla))|flashattnfwd|flash::|fmha(?!.*mla)|kernel_unified_attention|"
                     r"paged_attention_v[12]|batchprefillwithpagedkvcache|batchdecodewithpagedkvcache|"
                     r"batchprefillwithraggedkvcache|singledecodewithkvcache|_fwd_kernel_stage1|"
                     r"_fwd_grouped_kernel_stage1|prefillwithkvcache|decodewithkvcache")
MLA_KERNELS = r"flash_fwd_splitkv_mla|flashmla|flash_mla|mla_decode|fmhamla|fmha_mla|cutlass_mla|batchmlapaged"


def mix_shape(mix) -> dict:
    """The attention sizes the phase plan reads (``batch``, ``s_q``, ``s_kv``: ``rules.sdpa``'s detail) of a mix:
    its decodes (one query over their context) when it has no chunk, else its first chunk's."""
    if mix.chunks:
        q, c = mix.chunks[0]
        return {"batch": len(mix.chunks), "s_q": q, "s_kv": q + c}
    n, c = mix.decodes[0]
    return {"batch": mix.decode_sequences, "s_q": 1, "s_kv": c}


def paged_attention(a):
    """One layer's attention of the engine step's mix (the module docstring), heads per rank under tp."""
    m, mix = a.model, a.mix
    if m is None or mix is None:
        return None
    if m.mla:
        return mla_attention(a)
    hq, hkv = m.n_heads // a.tp, max(m.n_kv_heads // a.tp, 1)
    window = m.windows[a.layer] if a.layer is not None else 0
    kv = "fp8" if re.search(r"e4m3|fp8", a.low) else "bf16"
    c = mix.attention(hq, hkv, m.head_dim, window=window, kv_dtype=kv)
    sig = f"{mix.text()} h{hq}/{hkv} d{m.head_dim}" + (f" window {window}" if window else "") + f" kv {kv}"
    return a.op(c, "bf16", sig, "KV lengths from the step mix", {"layer": a.layer, "window": window,
                                                                "tokens": mix.tokens, **mix_shape(mix)})


def mla_attention(a):
    m, mix = a.model, a.mix
    if m is None or mix is None or not m.mla:
        return None
    h = m.n_heads // a.tp
    kv = "fp8" if re.search(r"e4m3|fp8", a.low) else "bf16"
    c = mix.mla_attention(h, m.kv_lora_rank, m.qk_rope_dim, kv_dtype=kv)
    if c is None:
        return None
    return a.op(c, "bf16", f"{mix.text()} h{h} latent {m.kv_lora_rank}+{m.qk_rope_dim} kv {kv}",
                "KV lengths from the step mix", {"layer": a.layer, "tokens": mix.tokens, **mix_shape(mix)})


@rule(kernels=r"flash_fwd.*combine|flashattnfwdcombine|attention_combine|mla_combine|_fwd_kernel_stage2|"
              r"merge_state|reduce_segments|splitkv_reduce", category="attention",
      priority=11)
def attention_combine(a):        # split-KV partial outputs merged: the splits are not recorded
    return None


@rule(kernels=MLA_KERNELS, category="attention", tensor_cores=True, priority=10)
def mla_decode(a):
    return mla_attention(a)


@rule(kernels=ATTENTION_KERNELS, category="attention", tensor_cores=True, priority=10)
def attention_kernel(a):
    return paged_attention(a)
