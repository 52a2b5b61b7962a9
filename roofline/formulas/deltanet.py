"""Gated DeltaNet linear attention (Qwen3-Next, Qwen3.5): the short causal conv1d over q, k and v and its state,
the gates (beta, the decay g), the gated delta rule as a chunked prefill and as a recurrent decode step, the
gated RMSNorm of its output, and the sigmoid output gate of the gated full-attention layers.

Sizes: ``k_heads`` query/key heads of width ``k_dim``, ``v_heads`` value heads of width ``v_dim`` (each q/k head
serves v_heads / k_heads value heads: the rule runs per value head, q and k repeated). The recurrent state of
one sequence and one layer is [v_heads, k_dim, v_dim], held in fp32 (``STATE_DTYPE``: what the torch fallback
and FLA's kernels accumulate it in); the conv state is the last kernel - 1 inputs of its channels
(2 k_heads k_dim + v_heads v_dim), in the activation dtype. Neither grows with the context.

Conventions (beside the package's):

* Prefill runs the chunked algorithm (FLA's ``chunk_gated_delta_rule``, transformers' torch fallback) in chunks
  of ``chunk`` = 64 tokens (``DELTA_CHUNK``); the last partial chunk is counted as a full one, as both pad it.
  Per chunk and value head, the matmuls: k_beta k^T and q k^T (2 x 2 C^2 dk), the intra-chunk attention x the new
  values (2 C^2 dv), the two reads of the state (k_cumdecay S and q S) and its update k^T v_new (3 x 2 C dk dv);
  and the two unit-lower-triangular solves of the UT transform, C (C - 1) FLOPs per right-hand column
  (``delta_solve_flops``: dk + dv columns), which ``FlopCounterMode`` does not count (torch registers no
  formula for ``linalg.solve_triangular``). The elementwise decays, the beta products and the l2-norms of q and
  k are not counted (a few per element, beside C^2 dk per token).
* Decode runs the recurrent step: per value head, the decay (dk dv multiplies), S^T k (2 dk dv), the delta
  (2 dv), the rank-1 update (2 dk dv) and the output S^T q (2 dk dv): 7 dk dv + 2 dv FLOPs; the state is read
  once and written once (2 x [v_heads, k_dim, v_dim] x 4 bytes per sequence).
* The state is read when the sequence has one (decode, or a prefill chunk after cached tokens), and written
  once per chunk of a step; a prefill from scratch starts from zeros and reads none.
"""

from __future__ import annotations

from ..cost import Cost
from ..dtypes import bytes_per_element as _b

STATE_DTYPE = "fp32"     # the recurrent state's element
DELTA_CHUNK = 64         # the chunked prefill's chunk (FLA's and transformers' chunk_size)


def recurrent_state_bytes(v_heads: int, k_dim: int, v_dim: int) -> float:
    """One sequence's recurrent state in one layer: [v_heads, k_dim, v_dim] in ``STATE_DTYPE``."""
    return v_heads * k_dim * v_dim * _b(STATE_DTYPE)


def conv_state_bytes(channels: int, kernel: int, *, act_dtype: str = "bf16") -> float:
    """One sequence's conv state in one layer: the last kernel - 1 inputs of every channel (act dtype)."""
    return channels * (kernel - 1) * _b(act_dtype)


def deltanet_state_bytes(k_heads: int, v_heads: int, k_dim: int, v_dim: int, kernel: int, *,
                         act_dtype: str = "bf16") -> float:
    """One sequence's whole state in one layer: the recurrent state and the conv state of its
    2 k_heads k_dim + v_heads v_dim channels (what a server keeps per sequence, whatever the context)."""
    return (recurrent_state_bytes(v_heads, k_dim, v_dim)
            + conv_state_bytes(2 * k_heads * k_dim + v_heads * v_dim, kernel, act_dtype=act_dtype))


def causal_conv1d(tokens: int, batch: int, channels: int, kernel: int, *, act_dtype: str = "bf16",
                  reads_state: bool = False, bias: bool = False) -> Cost:
    """The depthwise causal conv1d (kernel ``kernel``; a bias with ``bias``: Mamba-2's use_conv_bias) over
    ``channels`` and its SiLU, on ``tokens`` rows of ``batch`` sequences.

    FLOPs = 2 x kernel (the multiply-adds) + 4 (SiLU, as ``swiglu`` counts it) per element, + 1 (the bias add)
    with ``bias``. Bytes = read the input and write the output [T, channels] (act), the weight [channels, kernel]
    (and the bias [channels], act) once, write each sequence's conv state (``conv_state_bytes``) and read it when
    ``reads_state`` (decode, or after cached tokens)."""
    e = tokens * channels
    state = batch * conv_state_bytes(channels, kernel, act_dtype=act_dtype) * (2 if reads_state else 1)
    w = channels * (kernel + (1 if bias else 0)) * _b(act_dtype)
    return Cost((2 * kernel + 4 + (1 if bias else 0)) * e, 2 * e * _b(act_dtype) + w + state)


def delta_gates(tokens: int, v_heads: int, *, act_dtype: str = "bf16") -> Cost:
    """beta = sigmoid(b) and g = -exp(A_log) * softplus(a + dt_bias), per token and value head.

    FLOPs = 7 per (token, head): sigmoid's negate, add and divide; the add of dt_bias, softplus's add, the
    multiply and the negate (exp and log are not counted). Bytes = read a and b (act), write beta (act) and g
    (fp32), read A_log and dt_bias ([v_heads] each, act) once."""
    e = tokens * v_heads
    return Cost(7 * e, 3 * e * _b(act_dtype) + e * 4 + 2 * v_heads * _b(act_dtype))


def delta_chunks(new_tokens: int, chunk: int = DELTA_CHUNK) -> int:
    """Chunks of ``chunk`` tokens the prefill of ``new_tokens`` runs (the last padded to a full one)."""
    return -(-new_tokens // chunk)


def delta_solve_flops(chunks: int, v_heads: int, k_dim: int, v_dim: int, chunk: int = DELTA_CHUNK) -> int:
    """The two unit-lower-triangular solves of the UT transform (k_dim + v_dim right-hand columns): C (C - 1)
    FLOPs per column per chunk and value head. Not counted by FlopCounterMode (no formula registered)."""
    return chunks * v_heads * chunk * (chunk - 1) * (k_dim + v_dim)


def delta_prefill_flops(chunks: int, v_heads: int, k_dim: int, v_dim: int, chunk: int = DELTA_CHUNK) -> int:
    """The chunked gated delta rule's FLOPs for ``chunks`` chunks of one sequence (the matmuls, then the solves:
    module docstring)."""
    C = chunk
    mm = 4 * C * C * k_dim + 2 * C * C * v_dim + 6 * C * k_dim * v_dim
    return chunks * v_heads * mm + delta_solve_flops(chunks, v_heads, k_dim, v_dim, chunk)


def _io_bytes(tokens: int, k_heads: int, v_heads: int, k_dim: int, v_dim: int, act_dtype: str) -> float:
    """q, k [T, k_heads, k_dim] and v [T, v_heads, v_dim] read, beta (act) and g (fp32) read, the output
    [T, v_heads, v_dim] written."""
    a = _b(act_dtype)
    return tokens * ((2 * k_heads * k_dim + 2 * v_heads * v_dim + v_heads) * a + v_heads * 4)


def gated_delta_prefill(batch: int, new_tokens: int, k_heads: int, v_heads: int, k_dim: int, v_dim: int, *,
                        chunk: int = DELTA_CHUNK, act_dtype: str = "bf16", reads_state: bool = False) -> Cost:
    """The chunked gated delta rule over ``new_tokens`` of each of ``batch`` sequences (module docstring).

    Bytes = q, k, v, beta, g read and the output written (``_io_bytes``), each sequence's state written once
    and read once when it has one (``reads_state``)."""
    flops = batch * delta_prefill_flops(delta_chunks(new_tokens, chunk), v_heads, k_dim, v_dim, chunk)
    state = batch * recurrent_state_bytes(v_heads, k_dim, v_dim) * (2 if reads_state else 1)
    return Cost(flops, _io_bytes(batch * new_tokens, k_heads, v_heads, k_dim, v_dim, act_dtype) + state)


def gated_delta_decode(batch: int, k_heads: int, v_heads: int, k_dim: int, v_dim: int, *,
                       act_dtype: str = "bf16") -> Cost:
    """One recurrent step of the gated delta rule for each of ``batch`` sequences: 7 dk dv + 2 dv FLOPs per value
    head; the state read and written once (2 x ``recurrent_state_bytes``) beside q, k, v, beta, g and the
    output of one token."""
    flops = batch * v_heads * (7 * k_dim * v_dim + 2 * v_dim)
    state = 2 * batch * recurrent_state_bytes(v_heads, k_dim, v_dim)
    return Cost(flops, _io_bytes(batch, k_heads, v_heads, k_dim, v_dim, act_dtype) + state)


def gated_rmsnorm(rows: int, width: int, *, act_dtype: str = "bf16") -> Cost:
    """y = rmsnorm(x) * w * silu(z) over ``rows`` rows of ``width`` (one per token and value head).

    FLOPs = 9 per element (rmsnorm's 4, SiLU's 4, the product). Bytes = read x and z, write y, the weight
    [width] once (act)."""
    e = rows * width
    return Cost(9 * e, 3 * e * _b(act_dtype) + width * _b(act_dtype))


def sigmoid_gate(tokens: int, width: int, *, act_dtype: str = "bf16") -> Cost:
    """y = x * sigmoid(g) (the gated attention's output, g from q_proj's second half).

    FLOPs = 4 per element (negate, add 1, divide, multiply; the exp is not counted). Bytes = read x and g,
    write y."""
    e = tokens * width
    return Cost(4 * e, 3 * e * _b(act_dtype))
