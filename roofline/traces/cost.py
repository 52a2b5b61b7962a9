"""Costing a traced op from its recorded shapes and dtypes: the rule that matches its name, through
``roofline.formulas`` only.

``cost_op(name, args)`` returns an ``OpCost`` (category, ``Cost``, dtypes, a shape signature)
for an op a rule costs, ``FRAMEWORK`` for an op that moves no data (views, allocations,
metadata: its cost is truly zero), or None for an op no rule knows: such an op is *uncosted*;
its time is counted, never given a guessed cost. The rules are ``roofline.traces.registry``'s
(the match order is there), one file per ecosystem in ``roofline.traces.rules``; ``categories()``
lists every category they declare.

The table (each entry names the formula it uses; the conventions are ``formulas``'s):

* GEMM: ``aten::mm``, ``addmm``, ``bmm``, ``baddbmm``, ``_scaled_mm`` (fp8: A and B in fp8,
  C in ``out_dtype``) -> ``formulas.gemm`` (A + B + C [+ bias]; 2MNK [+ MN]).
  ``aten::linear`` / ``aten::matmul`` are *wrappers*: costed through what they call, and from
  their own shapes only when nothing below them is costed (``WRAPPERS``). (``rules.aten``)
* Attention: ``aten::scaled_dot_product_attention`` and its flash / efficient / cudnn / math
  variants, ``aten::_flash_attention_forward``, ``aten::_efficient_attention_forward``,
  ``flash_attn::_flash_attn_forward`` (and its varlen form for one sequence) ->
  ``formulas.prefill_attention`` (S_q > 1; halved when causal) or ``formulas.decode_attention``
  (S_q = 1). Causal comes from the recorded ``is_causal``; with an explicit mask and
  S_q > 1 it is *assumed* causal (a decoder's mask), and the signature says "causal assumed".
  (``rules.sdpa``)
* LLM custom ops (``rules.custom``): RMSNorm (``aten::rms_norm``, vLLM ``_C::rms_norm`` /
  ``fused_add_rms_norm``, SGLang ``sgl_kernel::rmsnorm`` ...) -> ``rmsnorm`` / ``add_rmsnorm``; SiLU-and-mul ->
  ``swiglu``; vLLM ``_C::rotary_embedding`` -> ``rope``; ``reshape_and_cache[_flash]`` ->
  ``kv_append``.
* Serving engines (``rules.vllm``, ``rules.sglang``, ``rules.triton_inductor``): quantized GEMMs and quantize
  ops at their formats' bytes (``roofline.precision.formats``); fused MoE kernels ("moe") by
  ``formulas.moe_expert_launches``; paged attention kernels by the engine step's mix
  (``roofline.traces.engine_steps``: KV lengths are tensor values, so they come from ``--mix``); Inductor's
  kernels by their launch records. Kernel rules (``cost_kernel``) cost the kernels of ops no rule costs.
* Elementwise (``ELEMENTWISE``: FLOPs per output element, 0 for exp/rsqrt/casts), reductions,
  softmax, copies and casts (``copy_``, ``cat``), gathers (``embedding``, ``index_select``),
  scatters (``index_put_``), fills -> ``elementwise``, ``reduction``, ``softmax``, ``copy``,
  ``embedding``, ``fill``. A 0-dim input (a Python scalar) is a kernel argument: no bytes.
  (``rules.elementwise``, ``rules.aten``)
* Collectives (``rules.collectives``; ``record_param_comms`` with its message sizes, ``c10d::``, ``nccl:*``):
  category "communication": bytes on the wire by ``formulas.collective_bytes``, kept off
  the HBM roofline.

Where TraceLens's perf models differ (stated in the report's conventions): GEMM bytes and
FLOPs are the same (A + B + C + bias; 2MNK + MN); causal attention is halved in both, but we
also halve with a cached prefix (n*p + n*n/2 pairs, TraceLens refuses S_q != S_kv) and read
K and V once per KV head in both; TraceLens counts softmax at 3 FLOPs per element (ours 4),
counts a 0-dim scalar input as one element read (ours: none), and assumes an fp8 GEMM writes
fp16 (ours: the recorded ``out_dtype``).
"""

from __future__ import annotations

from . import rules  # noqa: F401  (registers the built-in rules)
from ..errors import RooflineError
from .opcost import FRAMEWORK, KernelArgs, OpArgs, OpCost
from .registry import categories, kernel_rule_for, rule_for

__all__ = ["FRAMEWORK", "OpCost", "WRAPPERS", "categories", "cost_kernel", "cost_op", "is_wrapper"]

# Wrappers run other ops: costed through what they call, and from their own shapes only when they
# launched a kernel themselves with nothing costed below them (``roofline.traces.analyze``). A prefix:
# ``aten::linear`` covers ``aten::linear_backward`` too.
WRAPPERS = ("aten::linear", "aten::matmul", "aten::clone", "aten::contiguous", "aten::_to_copy", "aten::reshape",
            "aten::flatten", "c10d::", "_c10d_functional::")


def is_wrapper(name: str) -> bool:
    return name.startswith(WRAPPERS)


def cost_op(name: str, args: dict, default_dtype: str = "bf16"):
    """An ``OpCost``, ``FRAMEWORK`` (moves nothing), or None (uncosted: no rule, or no shapes).

    ``default_dtype`` is the run's activation dtype, used only where the trace records no dtype
    (a ``cat`` of a TensorList), and then said in the signature ("dtype assumed").
    """
    r = rule_for(name)
    if r is None:
        return None
    a = OpArgs(name, args, r, default_dtype)
    if r.shapes and not a.dims:
        return None
    try:
        return r.cost(a)
    except (TypeError, ValueError, IndexError, ZeroDivisionError):
        return None      # shapes the rule did not expect: uncosted rather than guessed


def cost_kernel(kernel: str, op=None, *, meta=None, step=None, model=None, nth: int = 0, nth_in_op: int = 0,
                tp: int = 1, default_dtype: str = "bf16", replay=None, position=None, notes=None):
    """A GPU kernel's ``OpCost`` by the kernel rule its name matches (``registry``: ``kernels=`` with a cost), or
    None: no such rule, or one that cannot cost it from what is known (its op's shapes, the step, ``--model``).

    Tried for kernels whose op no rule costs (a custom op: ``vllm::moe_forward``, a paged-attention op), and
    for kernels no op launched. ``replay``/``position``: the graph replay (``opcost.ReplayKernels``) a kernel ran in
    and its index there; ``notes``: a list that collects the rules' sentences about the trace."""
    r = kernel_rule_for(kernel)
    if r is None or r.cost is None or r.names or r.pattern is not None:   # an op rule's kernels: category only
        return None
    a = KernelArgs(kernel, op.name if op is not None else "", op.args if op is not None else {}, r, default_dtype,
                   meta=meta, step=step, model=model, nth=nth, nth_in_op=nth_in_op, tp=tp, replay=replay,
                   position=position, notes=notes)
    try:
        out = r.cost(a)
    except (TypeError, ValueError, IndexError, ZeroDivisionError, KeyError, AttributeError, RooflineError):
        return None      # what the rule needs is not there: uncosted rather than guessed
    return out if isinstance(out, OpCost) else None
