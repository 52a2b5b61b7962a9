"""Mamba-2 (Nemotron-H, Granite-4.0-H): the SSD scan as a chunked prefill and as a recurrent decode step, and the
state a sequence keeps. The projections (in_proj: z, x, B, C, dt; out_proj) are linears, the causal conv1d over
x, B, C is ``deltanet.causal_conv1d`` (with its bias) and the gated RMSNorm ``deltanet.gated_rmsnorm``.

Sizes: ``heads`` SSM heads of ``head_dim`` channels (the inner width I = heads x head_dim), a state of width
``state`` (d_state) per channel, B and C in ``groups`` groups (each shared by heads / groups heads). The SSM
state of one sequence and one layer is [heads, head_dim, state], held in fp32 (``MAMBA_STATE_DTYPE``:
transformers' mamba_ssm_cache_dtype default and what mamba_ssm's kernels accumulate in); the conv state is the
last kernel - 1 inputs of the conv's I + 2 groups state channels, in the activation dtype (what vLLM's cache
keeps; transformers' keeps kernel columns and its update convolves one more). Neither grows with the context.

Conventions (beside the package's):

* Prefill runs the SSD chunked algorithm (mamba_ssm's ``mamba_chunk_scan_combined``, transformers' torch
  fallback) in chunks of the config's chunk_size C; the last partial chunk is counted as a full one (the torch
  path pads it). Per chunk and head, the matmuls: the scores C B^T (2 C^2 d_state), the intra-chunk output scores
  x x (2 C^2 head_dim), the chunk's state B^T x (2 C head_dim d_state), the output's read of the state C S
  (2 C head_dim d_state); and the state passing between chunks as the kernel's sequential scan, one
  multiply-add per state element and chunk (2 head_dim d_state). NB: transformers' torch path passes the states
  by a dense [chunks + 1, chunks + 1] product, 2 (chunks + 1)^2 head_dim d_state per head, which
  ``FlopCounterMode`` counts instead. The elementwise work (dt's softplus, the discretisation, the decay
  masks and exps, the D skip) is not counted (a few per element, beside C d_state per token).
* Decode runs the recurrent step (mamba_ssm's ``selective_state_update``): per head, the state decayed, the
  input dt B x added (3 per state element: two multiplies and the add), the output C S (2 per state element)
  and the D skip (2 per channel): 5 head_dim d_state + 2 head_dim FLOPs; the per-head scalars (dt, exp(dt A),
  dt B: d_state + 1) are not counted. The state is read once and written once (2 x [heads, head_dim, state] x 4
  bytes per sequence).
* The state is read when the sequence has one (decode, or a prefill chunk after cached tokens), and written
  once per chunk of a step; a prefill from scratch starts from zeros and reads none. A_log, dt_bias and D
  ([heads] each, the activation dtype) are read once per step.
"""

from __future__ import annotations

from ..cost import Cost
from ..dtypes import bytes_per_element as _b
from .deltanet import conv_state_bytes

MAMBA_STATE_DTYPE = "fp32"     # the SSM state's element (transformers' mamba_ssm_cache_dtype "float32")


def ssm_state_bytes(heads: int, head_dim: int, state: int) -> float:
    """One sequence's SSM state in one layer: [heads, head_dim, state] in ``MAMBA_STATE_DTYPE``."""
    return heads * head_dim * state * _b(MAMBA_STATE_DTYPE)


def mamba_conv_channels(heads: int, head_dim: int, state: int, groups: int) -> int:
    """The conv1d's channels: x (heads x head_dim) and B, C (groups x state each)."""
    return heads * head_dim + 2 * groups * state


def mamba_state_bytes(heads: int, head_dim: int, state: int, groups: int, kernel: int, *,
                      act_dtype: str = "bf16") -> float:
    """One sequence's whole state in one Mamba-2 layer: the SSM state and the conv state (kernel - 1 inputs of
    ``mamba_conv_channels``), what a server keeps per sequence whatever the context."""
    return (ssm_state_bytes(heads, head_dim, state)
            + conv_state_bytes(mamba_conv_channels(heads, head_dim, state, groups), kernel, act_dtype=act_dtype))


def ssd_chunks(new_tokens: int, chunk: int) -> int:
    """Chunks of ``chunk`` tokens the prefill of ``new_tokens`` runs (the last padded to a full one)."""
    return -(-new_tokens // chunk)


def ssd_prefill_flops(chunks: int, heads: int, head_dim: int, state: int, chunk: int) -> int:
    """The SSD chunked scan's FLOPs for ``chunks`` chunks of one sequence (module docstring): per chunk and head
    2 C^2 (state + head_dim) + 4 C head_dim state + 2 head_dim state."""
    C, p, n = chunk, head_dim, state
    return chunks * heads * (2 * C * C * (n + p) + 4 * C * p * n + 2 * p * n)


def _io_bytes(tokens: int, heads: int, head_dim: int, state: int, groups: int, act_dtype: str) -> float:
    """x [T, I], B and C [T, groups, state], dt [T, heads] read and y [T, I] written (act)."""
    return tokens * (2 * heads * head_dim + 2 * groups * state + heads) * _b(act_dtype)


def _vectors(heads: int, act_dtype: str) -> float:
    """A_log, dt_bias and D, [heads] each (act)."""
    return 3 * heads * _b(act_dtype)


def ssd_prefill(batch: int, new_tokens: int, heads: int, head_dim: int, state: int, groups: int, *, chunk: int,
                act_dtype: str = "bf16", reads_state: bool = False) -> Cost:
    """The SSD chunked scan over ``new_tokens`` of each of ``batch`` sequences (module docstring).

    Bytes = x, B, C, dt read and y written (``_io_bytes``), A_log, dt_bias, D once, each sequence's state
    written once and read once when it has one (``reads_state``)."""
    flops = batch * ssd_prefill_flops(ssd_chunks(new_tokens, chunk), heads, head_dim, state, chunk)
    st = batch * ssm_state_bytes(heads, head_dim, state) * (2 if reads_state else 1)
    return Cost(flops, _io_bytes(batch * new_tokens, heads, head_dim, state, groups, act_dtype)
                + _vectors(heads, act_dtype) + st)


def ssd_decode(batch: int, heads: int, head_dim: int, state: int, groups: int, *, act_dtype: str = "bf16") -> Cost:
    """One recurrent step of the SSM for each of ``batch`` sequences: 5 head_dim state + 2 head_dim FLOPs per
    head; the state read and written once (2 x ``ssm_state_bytes``) beside x, B, C, dt and y of one token and
    A_log, dt_bias, D."""
    flops = batch * heads * (5 * head_dim * state + 2 * head_dim)
    st = 2 * batch * ssm_state_bytes(heads, head_dim, state)
    return Cost(flops, _io_bytes(batch, heads, head_dim, state, groups, act_dtype) + _vectors(heads, act_dtype) + st)
