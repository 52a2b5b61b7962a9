"""The two backends behind one interface: ``get_ops("triton")`` or ``get_ops("torch")``.

Every op has the same signature in both; the model and the runners call only these. The
torch backend is the "best plain PyTorch" peer: cuBLAS matmul, SDPA for prefill attention,
a batched gather-and-matmul decode attention (and verify attention: k + 1 queries per sequence, causal among
them, ``decode_attention.verify_attention`` / ``torch_verify``), fp32 math for the vector ops.

Quantized weights (``kernels.quant_weight.QuantWeight``, any registered format) go through the same ``linear``:
the triton backend runs the format's kernel (``weight_format(dtype).triton_linear``: ``linear_int8``,
``linear_int4``, ``linear_fp8``'s W8A8 GEMM, ``linear_fp4``), the torch backend the ecosystem's quantized GEMM or
a dequantize reference (``quant.torch_linear``). An 8-bit KV cache goes through the same ``kv_append`` and attention
ops with ``scales=(k_scale, v_scale)``.

``relu2`` (``kernels.relu2``): Nemotron-H's ungated MLP activation relu(x)^2.

Mixture of experts: ``route`` (``kernels.router``: torch on both backends) and ``moe_experts`` (the fused
grouped GEMM, ``kernels.moe``; the torch peer loops over experts in the input dtype).

MLA (``kernels.mla``): ``mla_decode`` is the absorbed Triton kernel / its batched torch peer; ``mla_prefill`` is
the naive torch path (SDPA) on both backends (``prefill_attention`` needs V's head dim equal to Q/K's).

Mamba-2 (``kernels.mamba``, ``kernels.conv1d``): ``conv1d`` (the causal conv with its bias and conv state),
``ssd_prefill`` (the SSD chunked scan to the slot's final state), ``ssd_decode`` (the recurrent step) and
``gated_group_rmsnorm``: Triton kernels, or transformers' torch path.
Gated DeltaNet (``kernels.deltanet``; its conv is Mamba-2's ``conv1d`` with no bias): ``delta_gates``, ``delta_prefill``
(the chunked rule) and ``delta_decode`` (the recurrent step) on a slot state, ``gated_rmsnorm``, and the gated
attention's ``sigmoid_gate``: Triton kernels, or transformers' torch fallbacks.
DeepSeek Sparse Attention (``kernels.dsa``): ``index_scores`` (the indexer's Triton kernel / its batched torch
peer), ``mla_sparse_decode`` (the absorbed decode over the selected latents / its torch peer); ``layernorm`` (the
indexer's k_norm) is torch's on both.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from roofline.errors import RooflineError

from . import decode_attention as DA
from . import conv1d as CV
from . import deltanet as DN
from . import dsa as DSA
from . import embedding as E
from . import geglu as G
from . import kv_append as KV
from . import linear as L
from . import mamba as MB
from . import mla as MLA
from . import moe as MOE
from . import prefill_attention as PA
from . import relu2 as R2
from . import residual as R
from . import rmsnorm as N
from . import rope as P
from . import router as RT
from . import swiglu as S
from .quant import torch_linear
from .quant_weight import QuantWeight, weight_format

BACKENDS = ("triton", "torch")


def _triton_linear(x, w, bias=None, **config):
    if isinstance(w, QuantWeight):
        return weight_format(w.dtype).triton_linear(x, w, bias, **config)
    return L.linear(x, w, bias, **config)


def _torch_linear(x, w, bias=None):
    return torch_linear(x, w, bias) if isinstance(w, QuantWeight) else L.reference(x, w, bias)


def _torch_rope(q, k, cos, sin, pos):
    q.copy_(P.reference(q, cos, sin, pos))
    k.copy_(P.reference(k, cos, sin, pos))
    return q, k


def _torch_decode(q, k_cache, v_cache, lengths, slots, *, max_len=None, sm_scale=None, window=None, softcap=None,
                  scales=None, chunk=None):
    return DA.torch_decode(q, k_cache, v_cache, lengths, slots, max_len=max_len, sm_scale=sm_scale, window=window,
                           softcap=softcap, scales=scales, chunk=chunk)


def _torch_prefill(q, k_cache, v_cache, slots, cached=0, *, causal=True, sm_scale=None, window=None, softcap=None,
                   scales=None, chunk=None):
    return PA.sdpa(q, k_cache, v_cache, slots, cached, causal=causal, sm_scale=sm_scale, window=window,
                   softcap=softcap, scales=scales, chunk=chunk)


def _layernorm(x, w, b, eps):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, eps)


_OPS = {
    "triton": SimpleNamespace(
        name="triton", embedding=E.embedding, rmsnorm=N.rmsnorm, add_rmsnorm=N.add_rmsnorm, linear=_triton_linear,
        rope=P.rope, kv_append=KV.kv_append, prefill_attention=PA.prefill_attention,
        decode_attention=DA.decode_attention, verify_attention=DA.verify_attention, residual_add=R.residual_add,
        swiglu=S.swiglu, geglu=G.geglu, relu2=R2.relu2,
        moe_experts=MOE.moe_experts, route=RT.route,
        mla_decode=MLA.mla_decode, mla_prefill=MLA.mla_prefill, index_scores=DSA.index_scores,
        mla_sparse_decode=DSA.mla_sparse_decode, layernorm=_layernorm,
        conv1d=CV.causal_conv1d, ssd_prefill=MB.ssd_prefill, ssd_decode=MB.ssd_decode,
        gated_group_rmsnorm=MB.gated_group_rmsnorm,
        delta_gates=DN.delta_gates, delta_prefill=DN.gated_delta_prefill,
        delta_decode=DN.gated_delta_decode, gated_rmsnorm=DN.gated_rmsnorm, sigmoid_gate=DN.sigmoid_gate),
    "torch": SimpleNamespace(
        name="torch", embedding=E.reference, rmsnorm=N.reference, add_rmsnorm=N.add_reference, linear=_torch_linear,
        rope=_torch_rope, kv_append=KV.reference, prefill_attention=_torch_prefill,
        decode_attention=_torch_decode, verify_attention=DA.torch_verify, residual_add=R.reference, swiglu=S.reference,
        geglu=G.reference, relu2=R2.reference,
        moe_experts=MOE.torch_moe, route=RT.route,
        mla_decode=MLA.torch_decode, mla_prefill=MLA.mla_prefill, index_scores=DSA.scores_reference,
        mla_sparse_decode=DSA.torch_sparse_decode, layernorm=_layernorm,
        conv1d=CV.reference, ssd_prefill=MB.ssd_reference, ssd_decode=MB.step_reference,
        gated_group_rmsnorm=MB.gated_norm_reference,
        delta_gates=DN.gates_reference, delta_prefill=DN.chunk_reference,
        delta_decode=DN.recurrent_reference, gated_rmsnorm=DN.gated_norm_reference,
        sigmoid_gate=DN.sigmoid_gate_reference),
}


def get_ops(backend: str) -> SimpleNamespace:
    key = str(backend).strip().lower()
    if key not in _OPS:
        raise RooflineError(f"Unknown backend {backend!r}: choose one of {', '.join(BACKENDS)}.")
    return _OPS[key]
