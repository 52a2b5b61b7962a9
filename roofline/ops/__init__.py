"""Op kinds: the registry (``roofline.ops.registry``: ``OpKind``, ``KINDS``, ``register``, ``kind``) and one
entry module per family of kinds, each adapting an op's sizes (``roofline.op_spec.OpSpec.dims``) and the step
(``StepContext``) to the formulas of its family (``roofline.formulas``): ``matmul`` (linear), ``norms``
(norm, layernorm), ``pointwise`` (residual, activation, scale, softcap), ``embeddings`` (embedding), ``attention``
(rope, kv_append, attention), ``mla`` (latent_append, mla_up, mla_attention), ``dsa`` (index_append, index_scores,
index_topk), ``deltanet`` (conv1d, delta_gates, gated_delta, gated_norm, sigmoid_gate), ``mamba`` (ssd_scan), ``moe``
(router, experts, gate). Importing this package registers every kind; consumers (``roofline.workload``,
``roofline.analysis``) loop over ``KINDS`` and never branch on a kind's name.
"""

from . import (  # noqa: F401 (each registers)
    attention, deltanet, dsa, embeddings, mamba, matmul, mla, moe, norms, pointwise)
from .registry import KINDS, Dtypes, OpKind, StepContext, kind, no_weights, register  # noqa: F401
