"""Triton kernels of a Llama-style transformer, their torch references and costs.

One file per op (linear, linear_int8, linear_int4, rmsnorm, rope, swiglu, prefill_attention,
decode_attention, kv_append, embedding, residual; ``kernels.quant`` holds the quantized weights
and the 8-bit KV cache's rules), a model assembled from them (``kernels.model``), a
validation suite (``kernels.check``, CLI ``roofline check``), a compile check for sm_80 / sm_90
with no GPU (``kernels.compile_check``, ``roofline check --compile``; every launch goes through
``kernels._launch.launch`` so it can be recorded) and profiling runners (``kernels.runners``). ``_env`` is imported first: with no GPU it switches Triton to its
interpreter (TRITON_INTERPRET=1) before triton is imported.
"""

from . import _env  # noqa: F401  (must run before triton is imported)
