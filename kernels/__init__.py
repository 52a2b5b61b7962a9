"""Triton kernels of the op kinds the workload model prices, their torch references, and what runs them.

One file per kernel (linear, linear_int8, linear_int4, rmsnorm, rope, swiglu, geglu, prefill_attention,
decode_attention, kv_append, embedding, residual, router, moe, mla, sinks); ``kernels.quant_weight`` and
``kernels.quant`` hold the quantized weights and the 8-bit KV cache's rules. A model of any supported family
(dense, mixture of experts, latent attention) assembled from them with a KV cache and real or seeded weights
(``kernels.model``, ``kernels.weights``, ``kernels.checkpoint``), tensor and expert parallel across ranks
(``kernels.tp``). Profiling runners (``kernels.runners``: one per op kind, registered in
``kernels.runner_registry`` by ``kernels.runners_*``). A validation suite (``kernels.check``, CLI
``roofline check``) and a compile check for sm_80 / sm_90 with no GPU (``kernels.compile_check``, ``roofline
check --compile``; every launch goes through ``kernels._launch.launch`` so it can be recorded). ``env`` is
imported first: with no GPU it switches Triton to its interpreter (TRITON_INTERPRET=1) before triton is imported.
"""

from . import env  # noqa: F401  (must run before triton is imported)
