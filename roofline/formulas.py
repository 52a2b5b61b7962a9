"""Cost formulas, one small function per op: the single source of truth.

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
"""

from __future__ import annotations

import operator

from .cost import Cost
from .dtypes import bytes_per_element as _b

# Every formula returns a Cost; arguments are element counts and dtype names.


QUANTIZED_WEIGHTS = ("int8", "int4", "fp8")   # weight dtypes that carry scales (weight-only quantization)
QUANTIZED_KV = ("int8", "fp8")                 # KV-cache dtypes with per-token-per-head scales
INT4_GROUP = 128                               # the default int4 group: input rows sharing one scale
KV_SCALE_BYTES = 4                             # a KV scale is fp32


def linear(tokens: int, in_features: int, out_features: int, *,
           weight_dtype: str = "bf16", act_dtype: str = "bf16", group_size: int | None = None,
           zero_point: bool = False, bias: bool = False) -> Cost:
    """y[T, N] = x[T, K] @ W[K, N] (+ b[N] with ``bias``).

    FLOPs = 2*T*K*N, + T*N with a bias (one add per output). Bytes = weight K*N (weight dtype,
    read once per call) + its scales (``weight_scale_bytes``: 0 for a float weight) + input T*K +
    output T*N (activation dtype), + the bias's N elements once (activation dtype; Llama has no
    bias, Qwen2's q/k/v have one). The dequantization multiplies are NB: not FLOPs (a
    weight-only kernel folds them into the GEMM's epilogue or per group); the bias is added in
    the epilogue, so y is written once.
    """
    c = gemm(tokens, in_features, out_features, a_dtype=act_dtype, b_dtype=weight_dtype, out_dtype=act_dtype,
             bias=out_features if bias else 0, bias_dtype=act_dtype)
    return c + Cost(0, weight_scale_bytes(in_features, out_features, weight_dtype=weight_dtype, act_dtype=act_dtype,
                                          group_size=group_size, zero_point=zero_point))


def weight_scale_bytes(in_features: int, out_features: int, *, weight_dtype: str, act_dtype: str = "bf16",
                       group_size: int | None = None, zero_point: bool = False) -> float:
    """Bytes of the scales (and zero points) that dequantize a K x N weight, in the activation dtype.

    int8 / fp8: N (one symmetric scale per output channel). int4: ceil(K / g) x N scales, g =
    ``group_size`` (default ``INT4_GROUP``), doubled with ``zero_point``. Float weights: 0.
    """
    if weight_dtype not in QUANTIZED_WEIGHTS:
        return 0.0
    if weight_dtype != "int4":
        return out_features * _b(act_dtype)
    g = int(group_size or INT4_GROUP)
    groups = -(-in_features // g)
    return groups * out_features * _b(act_dtype) * (2 if zero_point else 1)


def quantized_weight_bytes(in_features: int, out_features: int, *, weight_dtype: str, act_dtype: str = "bf16",
                           group_size: int | None = None, zero_point: bool = False) -> float:
    """A K x N weight as stored: K*N in its dtype + ``weight_scale_bytes`` (int4, g=128: K*N/2 + K*N/128 x act)."""
    return in_features * out_features * _b(weight_dtype) + weight_scale_bytes(
        in_features, out_features, weight_dtype=weight_dtype, act_dtype=act_dtype, group_size=group_size,
        zero_point=zero_point)


def kv_scale_bytes(tokens: int, n_kv_heads: int, *, kv_dtype: str, kv_scales: bool = True) -> float:
    """The KV cache's scales for ``tokens`` tokens: 2 (K, V) x tokens x Hkv x 4 bytes (fp32, per token per KV
    head) for an int8 / fp8 cache; 0 for a float cache or with ``kv_scales=False``."""
    if not kv_scales or kv_dtype not in QUANTIZED_KV:
        return 0.0
    return 2 * tokens * n_kv_heads * KV_SCALE_BYTES


def gemm(m: int, k: int, n: int, *, batch: int = 1, a_dtype: str = "bf16", b_dtype: str = "bf16",
         out_dtype: str | None = None, bias: int = 0, bias_dtype: str | None = None) -> Cost:
    """C[batch, M, N] = A[batch, M, K] @ B[batch, K, N] (+ a bias of ``bias`` elements).

    FLOPs = 2*batch*M*N*K, plus batch*M*N for the bias add when there is one (one add per
    output; alpha/beta scaling is not counted). Bytes = A + B + C, each once in its own
    dtype (C in ``out_dtype``, default A's: an fp8 ``_scaled_mm`` writing bf16 is costed so),
    plus the bias once. ``linear`` is this with B the weight. Matches TraceLens's GEMM perf
    model (A + B + C + bias; 2MNK + MN with a bias).
    """
    out_dtype = out_dtype or a_dtype
    flops = 2 * batch * m * n * k + (batch * m * n if bias else 0)
    nbytes = batch * (m * k * _b(a_dtype) + k * n * _b(b_dtype) + m * n * _b(out_dtype))
    if bias:
        nbytes += bias * _b(bias_dtype or out_dtype)
    return Cost(flops, nbytes)


def linear_weight_bytes_from_flops(flops: float, rows: int, *, weight_dtype: str = "bf16") -> float:
    """A linear's K x N weight in bytes from its FLOPs (2 * rows * K * N, ``linear``) and its rows (tokens):
    what its repeated calls keep touching (a cache's working set). Quantization scales and a bias are left out."""
    return flops / (2 * rows) * _b(weight_dtype) if rows > 0 else 0.0


def weight_only_intensity(tokens: int, in_features: int, out_features: int, *,
                          weight_dtype: str = "bf16") -> float:
    """The seed's weight-only FLOP/byte: 2*T*K*N / (K*N*bytes_w). Activations ignored."""
    return 2 * tokens * in_features * out_features / (in_features * out_features * _b(weight_dtype))


def rmsnorm(tokens: int, hidden: int, *, act_dtype: str = "bf16", weight_dtype: str = "bf16") -> Cost:
    """y = x / sqrt(mean(x^2) + eps) * w.

    FLOPs = 4 per element (square, sum, scale, weight); the rsqrt is not counted.
    Bytes = read x, write y (activations) + the weight vector once.
    """
    flops = 4 * tokens * hidden
    nbytes = 2 * tokens * hidden * _b(act_dtype) + hidden * _b(weight_dtype)
    return Cost(flops, nbytes)


def add_rmsnorm(tokens: int, hidden: int, *, act_dtype: str = "bf16", weight_dtype: str = "bf16") -> Cost:
    """Fused residual add + RMSNorm: h = x + r; y = rmsnorm(h).

    FLOPs = 5 per element (the add, then rmsnorm's 4). Bytes = read x and r, write h
    (the new residual stream) and y, plus the weight once: 4 activation passes instead
    of the 3 + 2 = 5 of the unfused pair.
    """
    flops = 5 * tokens * hidden
    nbytes = 4 * tokens * hidden * _b(act_dtype) + hidden * _b(weight_dtype)
    return Cost(flops, nbytes)


def rope(tokens: int, n_heads: int, n_kv_heads: int, head_dim: int, *,
         act_dtype: str = "bf16") -> Cost:
    """Rotary embedding (Hugging Face half-rotation layout) applied to q and k in place.

    FLOPs = 3 per element of q and k (x*cos, rotate_half(x)*sin, their sum).
    Bytes = read and write q [T, Hq, D] and k [T, Hkv, D] (activations) + the cos and sin
    tables for each token's position, D/2 values each in fp32 (4*D bytes per token).
    """
    elems = tokens * (n_heads + n_kv_heads) * head_dim
    flops = 3 * elems
    nbytes = 2 * elems * _b(act_dtype) + tokens * head_dim * 4
    return Cost(flops, nbytes)


def swiglu(tokens: int, intermediate: int, *, act_dtype: str = "bf16") -> Cost:
    """y = silu(gate) * up, silu(g) = g / (1 + exp(-g)).

    FLOPs = 5 per element (negate, add 1, divide, multiply by g, multiply by up); the exp
    is not counted. Bytes = read gate and up, write y.
    """
    flops = 5 * tokens * intermediate
    nbytes = 3 * tokens * intermediate * _b(act_dtype)
    return Cost(flops, nbytes)


def geglu(tokens: int, intermediate: int, *, act_dtype: str = "bf16") -> Cost:
    """y = gelu_tanh(gate) * up, gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) (Gemma's MLP).

    FLOPs = 9 per element: g^3 (2 multiplies), x 0.044715, + g, x sqrt(2/pi), 1 + tanh, x 0.5, x g,
    x up; the tanh, like the exp, is not counted. Bytes = read gate and up, write y (as ``swiglu``).
    """
    flops = 9 * tokens * intermediate
    nbytes = 3 * tokens * intermediate * _b(act_dtype)
    return Cost(flops, nbytes)


def residual_add(tokens: int, hidden: int, *, act_dtype: str = "bf16") -> Cost:
    """h = x + r: 1 FLOP per element; read two, write one (``elementwise`` with two inputs)."""
    e = tokens * hidden
    return elementwise(e, ((e, act_dtype), (e, act_dtype)), out_dtype=act_dtype)


def embedding(tokens: int, hidden: int, *, weight_dtype: str = "bf16", act_dtype: str = "bf16",
              vocab_shards: int = 1) -> Cost:
    """Gather rows of the [vocab, H] table: 0 FLOPs.

    Bytes = the T gathered rows (weight dtype, NB: not the whole table) + the output
    [T, H] (activations) + the int64 token ids (8 bytes each).
    Vocab-parallel (``vocab_shards`` = N tensor-parallel ranks, each holding 1/N of the rows):
    a rank gathers only the rows it holds, T/N of them for token ids spread evenly over the
    vocabulary (NB: an expectation, the true share depends on the ids), and still writes the
    whole [T, H] output (zeros where another rank holds the row) for the all-reduce that sums them.
    """
    rows = tokens * hidden * _b(weight_dtype) / vocab_shards
    nbytes = rows + tokens * hidden * _b(act_dtype) + 8 * tokens
    return Cost(0, nbytes)


def lm_head(rows: int, hidden: int, vocab: int, *, weight_dtype: str = "bf16", act_dtype: str = "bf16",
            group_size: int | None = None, zero_point: bool = False) -> Cost:
    """Logits for ``rows`` positions: a linear [rows, H] x [H, vocab].

    In prefill only the last position of each sequence needs logits, so rows = batch
    (NB: frameworks that compute logits for every prompt position pay prompt x more).
    """
    return linear(rows, hidden, vocab, weight_dtype=weight_dtype, act_dtype=act_dtype, group_size=group_size,
                  zero_point=zero_point)


def kv_append(tokens: int, n_kv_heads: int, head_dim: int, *,
              act_dtype: str = "bf16", kv_dtype: str = "bf16", kv_scales: bool = True) -> Cost:
    """Write the new tokens' K and V into the cache: 0 FLOPs.

    Bytes = read k and v [T, Hkv, D] (activations) + write them into the cache (KV dtype) + an
    8-bit cache's scales (``kv_scale_bytes``). Quantizing (an absmax per row, a scale) is NB: not FLOPs.
    """
    c = copy(2 * tokens * n_kv_heads * head_dim, src_dtype=act_dtype, dst_dtype=kv_dtype)
    return c + Cost(0, kv_scale_bytes(tokens, n_kv_heads, kv_dtype=kv_dtype, kv_scales=kv_scales))


def causal_pairs(new_tokens: int, cached_tokens: int = 0) -> float:
    """(query, key) pairs that causal attention computes, by the halving convention.

    New queries at positions p..p+n-1 see the whole cached prefix (n*p pairs) and each
    other causally. The causal block is counted as n*n/2, the FlashAttention and Triton
    tutorial convention (the exact count is n*(n+1)/2; the diagonal is NB: ignored).
    """
    return new_tokens * cached_tokens + new_tokens * new_tokens / 2


def window_pairs(new_tokens: int, cached_tokens: int = 0, window: int | None = None) -> float:
    """(query, key) pairs of causal attention under a sliding window of ``window`` keys.

    A query at position i sees keys i - W < j <= i (W keys, itself included). By the halving
    convention of ``causal_pairs`` the count is the integral over x in [0, n] of min(W, p + x) dx
    (p = cached, n = new tokens): n*p + n^2/2 while p + n <= W (no key falls out: ``causal_pairs``),
    n*W once p >= W (every query sees a full window), and the two pieces summed between
    ((W - p)*p + (W - p)^2/2 up to the window's fill, then W per query). ``window`` None: no window.
    """
    n, p = new_tokens, cached_tokens
    if window is None or p + n <= _window(window):
        return causal_pairs(n, p)
    w = _window(window)
    if p >= w:
        return n * w
    fill = w - p                                   # new tokens until a query's window is full
    return fill * p + fill * fill / 2 + (n - fill) * w


def _window(window) -> int:
    """``window`` as an int of at least 1, or a ValueError naming the rule."""
    try:
        w = operator.index(window)
    except TypeError:
        w = 0
    if isinstance(window, bool) or w < 1:
        raise ValueError(f"window must be a whole number of keys of at least 1 (or None: no window), got {window!r}.")
    return w


def prefill_attention(batch: int, new_tokens: int, n_heads: int, n_kv_heads: int, head_dim: int, *,
                      cached_tokens: int = 0, causal: bool = True, window: int | None = None,
                      act_dtype: str = "bf16", kv_dtype: str = "bf16", kv_scales: bool = True) -> Cost:
    """softmax(q k^T / sqrt(D)) v for ``new_tokens`` queries over the prefix and themselves.

    FLOPs = 4 * B * Hq * D * pairs (2 for q.k, 2 for p.v per pair); pairs =
    S_q * S_kv non-causal, causal_pairs(S_q, prefix) causal (halved: the convention
    FlopCounterMode does NOT follow, so it reports twice ours for causal attention),
    window_pairs under a sliding ``window`` (causal only).
    Bytes = q read and o written (activations, Hq heads) + K and V of all
    S_kv = prefix + new tokens read once per KV head from the cache (KV dtype): under
    GQA a KV tile is shared by the Hq/Hkv query heads of its group. Under a window only the
    keys some query can see are read: S_kv = min(p + n, n + W - 1). An 8-bit cache adds its
    scales (``kv_scale_bytes`` of the S_kv tokens), read with it. Logit softcapping
    (s = c * tanh(s / c)) adds NB: no FLOPs (a tanh, like the exp, is not counted).
    """
    s_kv = cached_tokens + new_tokens
    if window is not None:
        if not causal:
            raise ValueError("a sliding window needs causal attention: pass causal=True, or window=None.")
        s_kv = min(s_kv, new_tokens + _window(window) - 1)
    pairs = window_pairs(new_tokens, cached_tokens, window) if causal else new_tokens * s_kv
    flops = 4 * batch * n_heads * head_dim * pairs
    q_o = 2 * batch * new_tokens * n_heads * head_dim * _b(act_dtype)
    kv = 2 * batch * s_kv * n_kv_heads * head_dim * _b(kv_dtype)
    kv += kv_scale_bytes(batch * s_kv, n_kv_heads, kv_dtype=kv_dtype, kv_scales=kv_scales)
    return Cost(flops, q_o + kv)


def decode_attention(batch: int, kv_len: int, n_heads: int, n_kv_heads: int, head_dim: int, *,
                     window: int | None = None, act_dtype: str = "bf16", kv_dtype: str = "bf16",
                     kv_scales: bool = True) -> Cost:
    """One new query per sequence over ``kv_len`` cached keys (the new token's included).

    FLOPs = 4 * B * Hq * S_kv * D, no causal halving (one query sees every key).
    Bytes = K and V, B * S_kv * Hkv * D each, read once per KV head (KV dtype) + q read
    and o written (activations). Intensity ~ Hq/Hkv FLOP per KV element: it does not grow
    with context, and batching does not share KV reads between sequences. An 8-bit cache adds
    its scales (``kv_scale_bytes`` of the B * S_kv tokens). Under a sliding ``window`` the query
    sees S_kv = min(kv_len, W) keys (FLOPs and bytes both). Softcapping adds NB: no FLOPs (a tanh).
    """
    if window is not None:
        kv_len = min(kv_len, _window(window))
    flops = 4 * batch * n_heads * kv_len * head_dim
    kv = 2 * batch * kv_len * n_kv_heads * head_dim * _b(kv_dtype)
    kv += kv_scale_bytes(batch * kv_len, n_kv_heads, kv_dtype=kv_dtype, kv_scales=kv_scales)
    q_o = 2 * batch * n_heads * head_dim * _b(act_dtype)
    return Cost(flops, kv + q_o)


def kv_cache_bytes(tokens: int, n_layers: int, n_kv_heads: int, head_dim: int, *, kv_dtype: str = "bf16",
                   kv_scales: bool = True, window: int | None = None) -> float:
    """Bytes that ``tokens`` cached tokens of one sequence occupy across ``n_layers`` layers: 2 (K, V) * L *
    Hkv * D * bytes, plus an 8-bit cache's scales (L x ``kv_scale_bytes``). Sliding-window layers
    (``window``) hold at most W tokens (a ring buffer): tokens = min(tokens, W). A model that mixes window
    and full layers calls this once per kind."""
    if window is not None:
        tokens = min(tokens, _window(window))
    return (2 * tokens * n_layers * n_kv_heads * head_dim * _b(kv_dtype)
            + n_layers * kv_scale_bytes(tokens, n_kv_heads, kv_dtype=kv_dtype, kv_scales=kv_scales))


# ---------------------------------------------------------------- multi-head latent attention (DeepSeek-V2/V3)
# The cache holds one latent per token per layer: c_kv (kv_lora_rank, after kv_a_layernorm) and the shared
# rope key k_pe (qk_rope_head_dim, rope applied), the same for every head. K and V are kv_b_proj's
# up-projections of c_kv: k_nope = c_kv W_UK^T (nope dims per head), v = c_kv W_UV^T (v_head_dim per head).

def mla_cache_bytes(tokens: int, n_layers: int, kv_lora_rank: int, rope_dim: int, *, kv_dtype: str = "bf16") -> float:
    """Bytes that ``tokens`` cached tokens of one sequence occupy across ``n_layers`` MLA layers:
    tokens * L * (kv_lora_rank + rope_dim) * bytes (one latent and one rope key per token, shared by
    every head). DeepSeek-V3 (rank 512, rope 64, 61 layers, bf16) at 4,096 tokens: 287,834,112."""
    return tokens * n_layers * (kv_lora_rank + rope_dim) * _b(kv_dtype)


def mla_decode_attention(batch: int, kv_len: int, n_heads: int, kv_lora_rank: int, rope_dim: int, *,
                         act_dtype: str = "bf16", kv_dtype: str = "bf16") -> Cost:
    """ABSORBED MLA decode (what ``kernels.mla.mla_decode`` runs): one query per sequence over ``kv_len``
    cached latents (the new token's included), scores and output in the latent space.

    The query arrives absorbed (q_nope W_UK: a [rank] vector per head) with its rope part (rope_dim);
    per head per key the score is q_latent . c_kv (rank) + q_pe . k_pe (rope dim), and the output is
    the probabilities times c_kv (rank): FLOPs = 2*B*H*S*(rank + rope) + 2*B*H*S*rank.
    Bytes = the latent cache, B * S * (rank + rope) (KV dtype), read ONCE per sequence: every head
    shares it (MQA-like, intensity ~ 2H FLOP per cached element), + q read (B*H*(rank + rope)) and
    o_latent written (B*H*rank) in the activation dtype. The absorption GEMMs (q_nope W_UK before,
    o_latent W_UV after) are not here: ``mla_absorb_flops``.
    """
    flops = 2 * batch * n_heads * kv_len * (kv_lora_rank + rope_dim) + 2 * batch * n_heads * kv_len * kv_lora_rank
    cache = batch * kv_len * (kv_lora_rank + rope_dim) * _b(kv_dtype)
    q_o = batch * n_heads * (2 * kv_lora_rank + rope_dim) * _b(act_dtype)
    return Cost(flops, cache + q_o)


def mla_prefill_attention(batch: int, new_tokens: int, n_heads: int, nope_dim: int, rope_dim: int, v_dim: int, *,
                          cached_tokens: int = 0, kv_lora_rank: int | None = None, causal: bool = True,
                          act_dtype: str = "bf16", kv_dtype: str = "bf16") -> Cost:
    """NAIVE MLA attention (prefill, as transformers' DeepseekV3Attention runs it): K and V are up-projected
    from the latents (kv_b_proj, a linear op counted apart) for all S_kv = cached + new tokens, then plain
    multi-head attention with per-head q/k dims nope + rope and v dims ``v_dim`` (H KV heads: no sharing).

    FLOPs = 2*B*H*pairs*(nope + rope) + 2*B*H*pairs*v_dim; pairs as ``prefill_attention`` (causal halving,
    ``causal_pairs``; S_q * S_kv non-causal). Bytes (activation dtype for the computed tensors): q read
    (B*n*H*(nope + rope)), K read (B*S_kv*H*(nope + rope)), V read (B*S_kv*H*v_dim), o written (B*n*H*v_dim),
    + the latent cache read for the cached prefix (B * cached * (``kv_lora_rank`` + rope), KV dtype; the new
    tokens' latents come from the projection), so ``kv_lora_rank`` is needed when ``cached_tokens`` > 0.
    With new_tokens=1 and causal=False it is the naive decode (each step re-expands the whole cache).
    """
    if cached_tokens and kv_lora_rank is None:
        raise ValueError("mla_prefill_attention with cached_tokens > 0 reads the latent cache: pass kv_lora_rank.")
    s_kv = cached_tokens + new_tokens
    pairs = causal_pairs(new_tokens, cached_tokens) if causal else new_tokens * s_kv
    qk = nope_dim + rope_dim
    flops = 2 * batch * n_heads * pairs * qk + 2 * batch * n_heads * pairs * v_dim
    act = batch * n_heads * (new_tokens * (qk + v_dim) + s_kv * (qk + v_dim)) * _b(act_dtype)
    latent = batch * cached_tokens * ((kv_lora_rank or 0) + rope_dim) * _b(kv_dtype)
    return Cost(flops, act + latent)


def mla_absorb_flops(tokens: int, n_heads: int, nope_dim: int, v_dim: int, kv_lora_rank: int) -> int:
    """FLOPs of the absorbed form's two per-head GEMMs for ``tokens`` queries: q_latent = q_nope W_UK
    (2*T*H*nope*rank) before the attention and o = o_latent W_UV^T (2*T*H*rank*v) after it:
    2*T*H*rank*(nope + v), the same as applying kv_b_proj to T tokens (their weight bytes are
    kv_b_proj's, H*(nope + v)*rank, read once per step)."""
    return 2 * tokens * n_heads * kv_lora_rank * (nope_dim + v_dim)


# ---------------------------------------------------------------- generic ops, as a profiler trace records them
# (``roofline.trace_cost`` costs a trace's ops through these; their conventions are the ones above.)

def elementwise(out_elements: int, inputs=(), *, out_dtype: str = "bf16", flops_per_element: float = 1) -> Cost:
    """An elementwise op: ``inputs`` is ((elements, dtype), ...) of the tensors it reads.

    FLOPs = flops_per_element x output elements (1 for add/mul/neg/compare, 4 for SiLU as
    ``swiglu`` counts it, 0 for exp/rsqrt/casts: exponentials, reciprocals and square roots
    are not FLOPs). Bytes = every input read once (a broadcast input at its own size) + the
    output written once. A 0-dim input (a scalar) is a kernel argument: pass no entry for it.
    ``residual_add`` is this with two inputs of T*H.
    """
    nbytes = sum(e * _b(d) for e, d in inputs) + out_elements * _b(out_dtype)
    return Cost(flops_per_element * out_elements, nbytes)


def reduction(in_elements: int, out_elements: int, *, in_dtype: str = "bf16", out_dtype: str | None = None) -> Cost:
    """sum / mean / max / min / norm over some dimensions.

    FLOPs = one combine per input element (a mean's final division per output is NB: not
    counted). Bytes = input read once + output written once. (TraceLens: the same.)
    """
    return Cost(in_elements, in_elements * _b(in_dtype) + out_elements * _b(out_dtype or in_dtype))


def softmax(rows: int, cols: int, *, in_dtype: str = "bf16", out_dtype: str | None = None) -> Cost:
    """softmax over the last dimension of [rows, cols].

    FLOPs = 4 per element (max, subtract, sum, divide; the exp is not counted: TraceLens
    counts 3). Bytes = read once, write once (a fused kernel; the max and sum stay on chip).
    """
    e = rows * cols
    return Cost(4 * e, e * _b(in_dtype) + e * _b(out_dtype or in_dtype))


def copy(elements: int, *, src_dtype: str = "bf16", dst_dtype: str | None = None) -> Cost:
    """A copy or a cast (copy_, contiguous, .to(dtype), cat, a scatter of ``elements``): 0 FLOPs.

    Bytes = read in the source dtype + write in the destination dtype. ``kv_append`` is this
    with the K and V rows. Index tensors of a scatter or gather are NB: not counted.
    """
    return Cost(0, elements * _b(src_dtype) + elements * _b(dst_dtype or src_dtype))


def fill(elements: int, *, dtype: str = "bf16") -> Cost:
    """fill_ / zero_ / a factory that writes (zeros, arange, full): 0 FLOPs, the output written once."""
    return Cost(0, elements * _b(dtype))


COLLECTIVE_WIRE = {"all_reduce": "2(n-1)/n", "all_gather": "(n-1)/n", "reduce_scatter": "(n-1)/n",
                   "all_to_all": "(n-1)/n", "broadcast": "1", "send": "1", "recv": "1"}


def _collective_kind(kind: str) -> str:
    """'allreduce', '_allgather_base', 'c10d::all_reduce_' ... -> all_reduce, all_gather, ..."""
    key = kind.lower().replace("allreduce", "all_reduce").replace("allgather", "all_gather")
    key = key.replace("reducescatter", "reduce_scatter").replace("alltoall", "all_to_all")
    return key.replace("_base", "").replace("_into_tensor", "").replace("_coalesced", "").strip("_")


def collective_bytes(kind: str, message_bytes: float, ranks: int) -> float:
    """Bytes one rank puts on the wire for a collective of ``message_bytes`` over ``ranks`` ranks.

    The ring algorithm's volume (nccl-tests' bus bandwidth factors): all_reduce 2(n-1)/n of
    the message, all_gather (n-1)/n of the gathered output, reduce_scatter (n-1)/n of the
    input, all_to_all (n-1)/n, broadcast / send / recv the message. This is traffic on the
    interconnect, not DRAM bytes: a collective is not placed on the HBM roofline.
    """
    n = max(int(ranks), 1)
    key = _collective_kind(kind)
    if key == "all_reduce":
        return 2 * (n - 1) / n * message_bytes
    if key in ("all_gather", "reduce_scatter", "all_to_all", "all_to_allv"):
        return (n - 1) / n * message_bytes
    return float(message_bytes)


def collective_steps(kind: str, ranks: int) -> int:
    """Sequential ring steps of a collective over ``ranks`` ranks: all_reduce 2(n-1) (a reduce-scatter
    then an all-gather), all_gather / reduce_scatter / all_to_all / broadcast n-1, send / recv 1; 0 for one rank."""
    n = max(int(ranks), 1)
    if n == 1:
        return 0
    key = _collective_kind(kind)
    if key == "all_reduce":
        return 2 * (n - 1)
    return 1 if key in ("send", "recv") else n - 1


def collective_time(kind: str, message_bytes: float, ranks: int, *, bandwidth: float, base_latency: float = 0.0,
                    hop_latency: float = 0.0, launches: int = 1) -> float:
    """Seconds for ``launches`` collectives moving ``message_bytes`` in all over ``ranks`` ranks.

    A latency term plus bytes on the wire over the link (nccl-tests doc/PERFORMANCE.md: time is
    "roughly equal to overhead + size / bw"; NCCL's own tuning model, src/graph/tuning.cc, costs
    a launch as baseLat + steps x hwLat):

        launches x (base_latency + collective_steps x hop_latency) + collective_bytes / bandwidth

    ``bandwidth`` is the link's per-direction bytes/s, which is what nccl-tests' bus bandwidth is
    compared against; ``message_bytes`` is the total of every launch (summed over prefill chunks).
    One rank moves nothing and waits for nobody: 0 s.
    """
    n = max(int(ranks), 1)
    if n == 1 or launches == 0:
        return 0.0
    wire = collective_bytes(kind, message_bytes, n)
    return launches * (base_latency + collective_steps(kind, n) * hop_latency) + (wire / bandwidth if wire else 0.0)


def bus_bandwidth(kind: str, message_bytes: float, seconds: float, ranks: int) -> tuple[float, float]:
    """(algbw, busbw) in bytes/s of one collective of ``message_bytes`` that took ``seconds``.

    nccl-tests' definitions (doc/PERFORMANCE.md): algbw = size / time; busbw = algbw x the ring
    factor (all_reduce 2(n-1)/n, all_gather and reduce_scatter (n-1)/n, broadcast 1), so busbw is
    ``collective_bytes`` / time: the per-rank, per-direction link traffic, comparable across rank
    counts and with the hardware's link bandwidth. For all_gather the size is the gathered output.
    """
    algbw = message_bytes / seconds
    return algbw, collective_bytes(kind, message_bytes, ranks) / seconds


# ---------------------------------------------------------------- mixture of experts (issue 21)
# A routed MoE FFN is two ops: the router (gate GEMM [H, E] + the choice of k experts per token) and the
# routed experts (a grouped GEMM over the experts the step's tokens chose). Expert weight bytes depend on how
# many DISTINCT experts a step touches, not on k: ``expected_distinct_experts``.

MOE_ROUTING = ("softmax_topk", "topk_softmax", "sigmoid_group")
# FLOPs per element of the expert activation (exps not counted): silu(g) * u as ``swiglu`` (5); GPT-OSS's
# clamped SwiGLU: clamp g (1), clamp u (2), alpha*g (1), sigmoid (negate, +1, divide: 3), g*sig (1), u+1 (1),
# the product (1) = 10.
MOE_ACTIVATION_FLOPS = {"silu": 5, "swiglu_oai": 10}


def expected_distinct_experts(n_experts: int, k: int, tokens: int, *, skew=None) -> float:
    """Expected number of distinct experts that ``tokens`` tokens, each routed to ``k`` of ``n_experts``, touch.

    Model: tokens route independently; each picks k DISTINCT experts, expert e being among them with
    probability q_e. Expert e is untouched by one token with probability 1 - q_e, by all T with (1 - q_e)^T,
    so by linearity of expectation  E[distinct] = sum_e 1 - (1 - q_e)^T.  This is exact under the model,
    whatever the joint law of a token's k choices: only the marginals q_e enter.
    * uniform routing (``skew`` None): q_e = k/E for every e, so E * (1 - (1 - k/E)^T)
      (Mixtral E=8, k=2, T=4: 8 * (1 - 0.75^4) = 5.46875);
    * ``skew``: E probabilities p_e summing to 1, the share of the T*k routed slots that go to expert e
      (a measured histogram, normalised); q_e = k * p_e (a token's k picks are distinct, so its expected
      picks of e are its probability of picking e), which must not exceed 1. Uniform p_e = 1/E gives the
      line above exactly. NB: the with-replacement form 1 - (1 - p_e)^(T k) would treat a token's k picks as
      independent draws and undercount (E=8, k=2, T=1: 1.875 instead of 2).
    """
    E, k, T = int(n_experts), int(k), int(tokens)
    if E < 1 or not 1 <= k <= E:
        raise ValueError(f"MoE routing needs 1 <= k <= n_experts, got k={k}, n_experts={E}: use the model's "
                         "num_experts_per_tok and expert count.")
    if T < 0:
        raise ValueError(f"tokens must be 0 or more, got {T}.")
    if skew is None:
        return E * (1.0 - (1.0 - k / E) ** T)
    p = [float(v) for v in skew]
    if len(p) != E or any(not v >= 0 for v in p) or abs(sum(p) - 1.0) > 1e-6:
        raise ValueError(f"skew must be {E} probabilities (one per expert, each >= 0) summing to 1, got {len(p)} "
                         f"summing to {sum(p):.6g}: normalise the expert histogram.")
    if max(p) * k > 1 + 1e-9:
        raise ValueError(f"skew gives an expert {max(p):.4g} of the routed slots, more than 1/k = {1 / k:.4g}: a "
                         "token picks k distinct experts, so no expert can take more than 1/k of them.")
    return sum(1.0 - max(0.0, 1.0 - k * v) ** T for v in p)


def _check_moe_kind(kind: str) -> str:
    if kind not in MOE_ROUTING:
        raise ValueError(f"unknown routing kind {kind!r}: choose one of {', '.join(MOE_ROUTING)}.")
    return kind


def routing(tokens: int, n_experts: int, k: int, *, kind: str = "softmax_topk", renorm: bool = True,
            n_group: int = 1, score_bias: bool = False, logits_dtype: str = "fp32") -> Cost:
    """Choosing k of E experts per token from the router's logits [T, E] (``kernels.router.route``).

    FLOPs per token (compares count as FLOPs, like softmax's max; exps are not counted):
    * "softmax_topk" (Mixtral, Qwen-MoE): softmax 4E (``softmax``) + top-k E (one compare per score)
      + the renormalisation 2k - 1 (k - 1 adds, k divides) with ``renorm``;
    * "topk_softmax" (GPT-OSS): top-k E + softmax over the k chosen 4k;
    * "sigmoid_group" (DeepSeek-V3): sigmoid 3E (negate, +1, divide) + E with ``score_bias`` (the correction
      bias added for the choice) + with ``n_group`` > 1 the group scores (E compares for each group's top-2,
      n_group adds, n_group compares to keep the best groups) + top-k E + renormalisation 2k (k - 1 adds,
      the +1e-20, k divides) with ``renorm`` + k multiplies (routed_scaling_factor).
    Bytes = logits read T*E (``logits_dtype``) + the fp32 weights and int64 ids written (12 T k) + the fp32
    score bias (E) read.
    """
    _check_moe_kind(kind)
    T, E, k = tokens, n_experts, k
    if kind == "softmax_topk":
        per = 4 * E + E + ((2 * k - 1) if renorm else 0)
    elif kind == "topk_softmax":
        per = E + 4 * k
    else:
        groups = (E + 2 * n_group) if n_group > 1 else 0
        per = 3 * E + (E if score_bias else 0) + groups + E + (2 * k if renorm else 0) + k
    nbytes = T * E * _b(logits_dtype) + 12 * T * k + (4 * E if score_bias else 0)
    return Cost(per * T, nbytes)


def router(tokens: int, hidden: int, n_experts: int, k: int, *, kind: str = "softmax_topk",
           weight_dtype: str = "bf16", act_dtype: str = "bf16", logits_dtype: str | None = None,
           gate_bias: bool = False, score_bias: bool = False, renorm: bool = True, n_group: int = 1) -> Cost:
    """The whole router: the gate GEMM logits[T, E] = x[T, H] @ W[H, E] (+ b[E] with ``gate_bias``: GPT-OSS)
    then ``routing``. Two launches (``ops.linear`` then ``ops.route``): the logits (``logits_dtype``, default
    the activation dtype; DeepSeek-V3 computes them in fp32 from an fp32 gate) are written once and read
    once. FLOPs = 2*T*H*E (+ T*E bias adds) + ``routing``'s; softmax exps are not FLOPs.
    """
    ld = logits_dtype or act_dtype
    gate = gemm(tokens, hidden, n_experts, a_dtype=act_dtype, b_dtype=weight_dtype, out_dtype=ld,
                bias=n_experts if gate_bias else 0, bias_dtype=weight_dtype)
    return gate + routing(tokens, n_experts, k, kind=kind, renorm=renorm, n_group=n_group, score_bias=score_bias,
                          logits_dtype=ld)


def moe_expert_weight_bytes(hidden: int, intermediate: int, *, weight_dtype: str = "bf16", act_dtype: str = "bf16",
                            group_size: int | None = None, zero_point: bool = False, bias: bool = False) -> float:
    """One expert's weights as stored: gate and up [H, I] and down [I, H] (``quantized_weight_bytes``: scales
    included), + its biases (2I + H, activation dtype) with ``bias`` (GPT-OSS). Mixtral-8x7B in bf16:
    3 * 4096 * 14336 * 2 = 352,321,536 bytes."""
    q = dict(weight_dtype=weight_dtype, act_dtype=act_dtype, group_size=group_size, zero_point=zero_point)
    w = 2 * quantized_weight_bytes(hidden, intermediate, **q) + quantized_weight_bytes(intermediate, hidden, **q)
    return w + ((2 * intermediate + hidden) * _b(act_dtype) if bias else 0)


def _expert_flops(rows: float, tokens: float, hidden: int, intermediate: int, k: int, activation: str,
                  bias: bool) -> float:
    """The routed experts' FLOPs for ``rows`` routed rows of ``tokens`` tokens (``moe_experts``, ``moe_experts_ep``):
    2*rows*3*H*I + the activation per element on rows*I + the routing weight multiply rows*H + the sum of each
    token's k partial outputs tokens*(k-1)*H (+ the biases rows*(2I + H) with ``bias``)."""
    if activation not in MOE_ACTIVATION_FLOPS:
        raise ValueError(f"unknown MoE activation {activation!r}: choose one of {', '.join(MOE_ACTIVATION_FLOPS)}.")
    H, I = hidden, intermediate
    flops = 2 * rows * 3 * H * I + MOE_ACTIVATION_FLOPS[activation] * rows * I + rows * H + tokens * (k - 1) * H
    return flops + (rows * (2 * I + H) if bias else 0)


def moe_experts(tokens: int, hidden: int, intermediate: int, n_experts: int, k: int, *, distinct: float | None = None,
                activation: str = "silu", bias: bool = False, weight_dtype: str = "bf16", act_dtype: str = "bf16",
                group_size: int | None = None, zero_point: bool = False) -> Cost:
    """The routed experts as the fused grouped GEMM runs them (``kernels.moe.moe_experts``): every token
    through k experts, h = act(x W_gate + b_g, x W_up + b_u) [T*k, I], then y = sum_k w_k (h W_down + b_d).

    FLOPs = 2*T*k*3*H*I (gate, up, down: k experts per token, whatever their spread) + the activation's
    per element on T*k*I (``MOE_ACTIVATION_FLOPS``: silu 5, swiglu_oai 10) + the biases' adds T*k*(2I + H)
    with ``bias`` + the routing weight multiply T*k*H + the sum of the k partial outputs T*(k-1)*H.
    Bytes = ``distinct`` experts' weights once each (``moe_expert_weight_bytes``; default
    ``expected_distinct_experts(E, k, T)``, uniform routing: the reuse fragmentation of decode) + x read
    T*H + y written T*H + the two launches' intermediates, each written and read once: h [T*k, I] (gate+up
    launch -> down launch) and the weighted partial outputs [T*k, H] (down launch -> the per-token sum), all in
    the activation dtype + the routing weights (fp32) and ids (int64) read, 12 T k. NB: x is counted once,
    though each of a token's k rows gathers it (from L2 in practice); the alignment's sorted ids are not counted.
    """
    T, H, I, E = tokens, hidden, intermediate, n_experts
    d = expected_distinct_experts(E, k, T) if distinct is None else float(distinct)
    if not 0 <= d <= E:
        raise ValueError(f"distinct experts must be between 0 and n_experts = {E}, got {distinct}.")
    rows = T * k
    flops = _expert_flops(rows, T, H, I, k, activation, bias)
    a = _b(act_dtype)
    weights = d * moe_expert_weight_bytes(H, I, weight_dtype=weight_dtype, act_dtype=act_dtype,
                                          group_size=group_size, zero_point=zero_point, bias=bias)
    nbytes = weights + 2 * T * H * a + 2 * rows * I * a + 2 * rows * H * a + 12 * rows
    return Cost(flops, nbytes)


# ---------------------------------------------------------------- expert parallelism (issue 21)
# With --ep N each of N ranks holds E/N whole experts. A MoE layer sends every routed (token, expert) row to the
# rank that holds its expert (the dispatch all-to-all) and the experts' outputs back (the combine all-to-all).


def moe_all_to_all_bytes(tokens: float, k: int, hidden: int, ranks: int, *, act_dtype: str = "bf16") -> float:
    """One rank's message of a MoE dispatch (or combine) all-to-all: the hidden states of its share of the step's
    routed rows, T*k*H*bytes / N (each rank owns T/N of the step's tokens and sends each one's k copies).

    This is nccl-tests' ``size`` for alltoall (each rank's send buffer, its own slice included); the bytes on
    the wire are ``collective_bytes("all_to_all", ...)`` = (N-1)/N of it (the rows routed to its own experts,
    1/N in expectation under uniform routing, stay home), and nccl-tests' bus bandwidth for alltoall is
    algbw x (N-1)/N (``bus_bandwidth``). Mixtral-8x7B decode, batch 8, bf16, 8 ranks: 8*2*4096*2/8 = 16,384.
    """
    n = int(ranks)
    if n < 1:
        raise ValueError(f"an all-to-all needs at least 1 rank, got {ranks}.")
    return tokens * k * hidden * _b(act_dtype) / n


def moe_experts_ep(tokens: float, hidden: int, intermediate: int, n_experts: int, k: int, ranks: int, *,
                   rows: float | None = None, distinct: float | None = None, activation: str = "silu",
                   bias: bool = False, weight_dtype: str = "bf16", act_dtype: str = "bf16",
                   group_size: int | None = None, zero_point: bool = False) -> Cost:
    """One rank's routed experts under expert parallelism: ``ranks`` = N ranks, each holding E/N of the
    ``n_experts`` whole experts (width ``intermediate``, not sliced), for a step of ``tokens`` = T tokens.

    The rank runs the grouped GEMM over the ``rows`` routed rows that reach its experts (default T*k/N, the
    expectation under uniform routing) and touches ``distinct`` of its E/N experts (default
    (E/N) * (1 - (1 - k/E)^T), its share of ``expected_distinct_experts``); it owns T/N tokens, and after the
    combine sums each one's k returned partial outputs.

    FLOPs = 2*rows*3*H*I + the activation's per element on rows*I (``MOE_ACTIVATION_FLOPS``) + the routing
    weight multiply rows*H (+ the biases rows*(2I + H) with ``bias``) + the sum of its tokens' k partials
    (T/N)*(k-1)*H.
    Bytes = ``distinct`` experts' weights once each + the dispatched rows read rows*H + h [rows, I] written and
    read + the weighted partials written rows*H + its tokens' returned partials read (T/N)*k*H + y written
    (T/N)*H, in the activation dtype, + 12 bytes per row of routing weight and id. NB: unlike ``moe_experts``
    (one rank: x read once per token, its k rows gathered from cache), each dispatched row is read from memory;
    the all-to-alls' own buffer copies are communication, not counted here.
    """
    T, H, I, E, N = tokens, hidden, intermediate, int(n_experts), int(ranks)
    if N < 1 or E % N:
        raise ValueError(f"expert parallelism needs a rank count that divides the {E} experts, got {ranks}.")
    local = E // N
    r = T * k / N if rows is None else float(rows)
    d = local * (1.0 - (1.0 - k / E) ** T) if distinct is None else float(distinct)
    if not 0 <= d <= local:
        raise ValueError(f"distinct experts on one rank must be between 0 and E/N = {local}, got {distinct}.")
    own = T / N
    flops = _expert_flops(r, own, H, I, k, activation, bias)
    a = _b(act_dtype)
    weights = d * moe_expert_weight_bytes(H, I, weight_dtype=weight_dtype, act_dtype=act_dtype,
                                          group_size=group_size, zero_point=zero_point, bias=bias)
    nbytes = weights + r * H * a + 2 * r * I * a + r * H * a + own * k * H * a + own * H * a + 12 * r
    return Cost(flops, nbytes)


def moe_rank_load(n_experts: int, k: int, tokens: float, ranks: int, *, skew=None) -> tuple:
    """(rows, distinct) on the busiest rank when ``ranks`` = N ranks each hold E/N consecutive experts (rank r:
    experts r*E/N .. (r+1)*E/N - 1) and a step routes ``tokens`` = T tokens to k experts each.

    rows: the routed (token, expert) rows that reach the rank, T*k * (its experts' share of the slots);
    distinct: its experts the step touches, sum over them of 1 - (1 - q_e)^T (``expected_distinct_experts``'s
    marginals q_e = k * p_e). Uniform routing (``skew`` None): every rank gets T*k/N rows and
    (E/N) * (1 - (1 - k/E)^T) experts. Under a skew the step waits for the rank with the most rows (ties: the
    most experts), so that rank's load is the one returned.
    """
    E, N = int(n_experts), int(ranks)
    if N < 1 or E % N:
        raise ValueError(f"expert parallelism needs a rank count that divides the {E} experts, got {ranks}.")
    local = E // N
    if skew is None:
        return tokens * k / N, local * (1.0 - (1.0 - k / E) ** tokens)
    expected_distinct_experts(E, k, int(tokens), skew=skew)      # validates the histogram (one line on misuse)
    p = [float(v) for v in skew]
    best = (-1.0, -1.0)
    for r in range(N):
        mine = p[r * local:(r + 1) * local]
        load = (tokens * k * sum(mine), sum(1.0 - max(0.0, 1.0 - k * v) ** tokens for v in mine))
        best = max(best, load)
    return best
