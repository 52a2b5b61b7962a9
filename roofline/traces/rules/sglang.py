"""Trace cost rules for SGLang's ops and the kernels of its attention backends (names and argument layouts from
SGLang's sources: ``sgl-kernel/python/sgl_kernel``, ``python/sglang/srt/layers/attention``, commit 01144484).

Ops, from their recorded shapes:

* ``sgl_kernel::fp8_scaled_mm(mat_a [M,K] fp8, mat_b [K,N] fp8, scales_a, scales_b, out_dtype, bias)`` and
  ``sgl_kernel::fp8_blockwise_scaled_mm(mat_a, mat_b, scales_a, scales_b, out_dtype)`` -> ``rules.vllm``'s
  quantized GEMM (``formulas.gemm``, the weight as ``roofline.precision.formats`` stores it); the fp8 quantize
  ops are ``rules.vllm``'s (``sgl_per_token_group_quant_fp8``, ``sgl_per_token_quant_fp8``).
* ``sgl_kernel::apply_rope_pos_ids_cos_sin_cache(q [T,Hq,D], k [T,Hkv,D], q_rope, k_rope, cos_sin_cache,
  pos_ids, interleave)`` -> ``formulas.rope``.

Kernels: the Triton backend's extend kernel (``_fwd_kernel``, exactly) -> the step mix's attention
(``rules.vllm.paged_attention``); its decode kernels (``_fwd_kernel_stage1``, ``_fwd_grouped_kernel_stage1``), the
FlashInfer and FA3 backends' kernels and the fused MoE (``fused_moe_kernel``) are ``rules.vllm``'s (one rule per
kernel, whichever engine launched it); DeepSeek's fused routing gate (``moe_fused_gate``) -> ``formulas.routing``.
"""

from __future__ import annotations

from ... import formulas as F
from ..opcost import signature
from ..registry import rule
from .vllm import _fp8_weight_format, moe_topk, paged_attention, quant_gemm


@rule(("sgl_kernel::fp8_scaled_mm", "sgl_kernel::fp8_blockwise_scaled_mm"), category="gemm", tensor_cores=True)
def fp8_scaled_mm(a):            # (mat_a [M,K], mat_b [K,N], scales_a, scales_b, out_dtype, [bias])
    x, w, xs, ws, bias = a.tensor(0), a.tensor(1), a.tensor(2), a.tensor(3), a.tensor(5)
    k, n = w[0][0], w[0][1]
    if x[0][-1] != k:
        return None
    fmt = "fp8-block" if a.base == "fp8_blockwise_scaled_mm" else _fp8_weight_format(ws, k, n)
    return quant_gemm(a, x, "bf16", xs, fmt, k, n, bias)


@rule("sgl_kernel::apply_rope_pos_ids_cos_sin_cache", category="rope")
def rope_pos_ids(a):
    q, k = a.tensor(0), a.tensor(1)
    if q is None or k is None or len(q[0]) != 3 or len(k[0]) != 3:
        return None
    return a.op(F.rope(q[0][0], q[0][1], k[0][1], q[0][2], act_dtype=q[1]), q[1], signature(q[0], k[0], dtype=q[1]))


@rule(kernels=r"^_fwd_kernel$", category="attention", tensor_cores=True, priority=10)
def triton_extend(a):
    return paged_attention(a)


@rule(kernels=r"moe_fused_gate", category="moe", priority=10)
def fused_gate(a):
    return moe_topk(a)
