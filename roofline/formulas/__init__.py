"""Cost formulas, one small function per op: the single source of truth.

One module per kind of work: ``matmul`` (GEMM, linear, lm_head), ``attention`` (rope, the KV cache, prefill
and decode attention), ``mla`` (latent attention), ``dsa`` (DeepSeek Sparse Attention's indexer and
top-k), ``deltanet`` (Gated DeltaNet linear attention, the gated
attention output), ``mamba`` (Mamba-2's SSD scan and state), ``moe`` (routing, the experts, expert parallelism), ``norms``, ``pointwise`` (activations,
residual, the generic trace ops), ``embeddings``, ``collectives``, ``quant`` (the bytes of scales) and
``speculative`` (a verify step's expected tokens, rejection sampling). This package exports them all:
``from roofline import formulas as F``.

Kernels call these from their ``cost()``; the workload model sums them per phase.
Conventions (also printed in reports):

* A multiply-add is 2 FLOPs: GEMM [M, K] x [K, N] = 2*M*N*K.
* Bytes are the minimal DRAM/HBM traffic of the op *as our kernels implement it*: each
  input read once, each output written once, weights once per call. Fusions are stated
  in the docstring of the op that does them.
* Exponentials, reciprocals and square roots are not counted as FLOPs (the
  FlashAttention convention); the elementwise FLOP counts below say what is counted.
* Weights, activations and the KV cache each have their own dtype, so quantized weights
  (int8/int4/fp8) and an 8-bit KV cache cost the right bytes, scales included:
  - int8 / fp8 weights: one scale per output channel (N of them), in the activation dtype;
  - int4 weights: one scale per group of ``group_size`` input rows per output channel
    (K/group_size x N, group 128 by default), plus as many zero points when ``zero_point``,
    in the activation dtype: int4 with groups is K*N/2 + (K/g)*N*(1 or 2)*act bytes;
  - an int8 / fp8 KV cache: one fp32 scale per token per KV head, for K and for V
    (2 x tokens x Hkv x 4 bytes), written by kv_append and read with the cache.
    ``kv_scales=False`` drops them (a framework's per-tensor scales: a few bytes in all).
* ``tokens`` always means all rows processed by the op: batch x new tokens.
* Every formula returns a Cost; arguments are element counts and dtype names.
"""

from __future__ import annotations

# The public names of every module below (F401: imported to be exported), and the Cost they all return.
from ..cost import Cost  # noqa: F401
from .quant import (  # noqa: F401
    INT4_GROUP, KV_SCALE_BYTES, QUANTIZED_KV, QUANTIZED_WEIGHTS, kv_scale_bytes, quantized_weight_bytes,
    weight_scale_bytes)
from .matmul import gemm, linear, linear_weight_elements_from_flops, lm_head, weight_only_intensity  # noqa: F401
from .norms import add_rmsnorm, layernorm, rmsnorm  # noqa: F401
from .pointwise import copy, elementwise, fill, geglu, reduction, relu2, residual_add, softmax, swiglu  # noqa: F401
from .embeddings import embedding  # noqa: F401
from .attention import (  # noqa: F401
    causal_pairs, chunk_keys, chunk_pairs, decode_attention, kv_append, kv_cache_bytes, prefill_attention, rope,
    window_pairs)
from .deltanet import (  # noqa: F401
    DELTA_CHUNK, STATE_DTYPE, causal_conv1d, conv_state_bytes, delta_chunks, delta_gates, delta_prefill_flops,
    delta_solve_flops, deltanet_state_bytes, gated_delta_decode, gated_delta_prefill, gated_rmsnorm,
    recurrent_state_bytes, sigmoid_gate)
from .dsa import (  # noqa: F401
    INDEX_KEY_DTYPE, INDEX_SCALE_BLOCK, index_append, index_cache_bytes, index_key_bytes, index_scores, index_topk,
    selected_pairs)
from .mamba import (  # noqa: F401
    MAMBA_STATE_DTYPE, mamba_conv_channels, mamba_state_bytes, ssd_chunks, ssd_decode, ssd_prefill, ssd_prefill_flops,
    ssm_state_bytes)
from .mla import mla_absorb_flops, mla_cache_bytes, mla_decode_attention, mla_prefill_attention  # noqa: F401
from .moe import (  # noqa: F401
    MOE_ACTIVATION_FLOPS, MOE_ROUTING, UNGATED, expected_distinct_experts, expert_matrices, moe_all_to_all_bytes, moe_expert_launches,
    moe_expert_weight_bytes, moe_experts, moe_experts_ep, moe_rank_load, router, routing)
from .collectives import (  # noqa: F401
    COLLECTIVE_WIRE, bus_bandwidth, collective_bytes, collective_steps, collective_time)
from .speculative import (  # noqa: F401
    expected_tokens, expected_tokens_from_positions, expected_tokens_from_rates, rejection_sampling)
