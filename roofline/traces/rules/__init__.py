"""The built-in trace cost rules, one file per ecosystem; importing this package registers them.

The file order is the registration order (``roofline.traces.registry``: equal priorities keep it):
``collectives`` (record_param_comms, c10d, NCCL: their prefixes before any other pattern),
``aten`` (GEMMs, copies and casts, gathers, scatters, fills, ops that move nothing), ``sdpa``
(scaled-dot-product and flash attention), ``elementwise`` (RMSNorm, elementwise, reductions,
softmax), ``custom`` (vLLM / SGLang custom ops by name pattern), ``vllm`` (quantized GEMMs, quantize ops,
custom all-reduce; fused MoE and paged attention kernels), ``sglang`` (its fp8 GEMMs, rope, Triton-backend
attention), ``triton_inductor`` (Inductor's generated kernels by their launch records), ``kernel_names`` (what a
GPU kernel with no op is, by its name), ``layer_position`` (a graph replay's kernels with no capture, sized by
their place in ``--model``'s layer sequence).
"""

from . import (collectives, aten, sdpa, elementwise, custom, vllm, sglang, triton_inductor, kernel_names,  # noqa: F401
               layer_position)
