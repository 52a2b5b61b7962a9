"""Mixture of experts (issue 21).

A routed MoE FFN is two ops: the router (gate GEMM [H, E] + the choice of k experts per token) and the
routed experts (a grouped GEMM over the experts the step's tokens chose). Expert weight bytes depend on how
many DISTINCT experts a step touches, not on k: ``expected_distinct_experts``.

Expert parallelism: with --ep N each of N ranks holds E/N whole experts. A MoE layer sends every routed
(token, expert) row to the rank that holds its expert (the dispatch all-to-all) and the experts' outputs back
(the combine all-to-all): ``moe_all_to_all_bytes``, ``moe_experts_ep``, ``moe_rank_load``.
"""

from __future__ import annotations

from ..cost import Cost
from ..dtypes import bytes_per_element as _b
from .matmul import gemm
from .quant import quantized_weight_bytes


MOE_ROUTING = ("softmax_topk", "topk_softmax", "sigmoid_group", "sigmoid_topk")
# FLOPs per element of the expert activation (exps not counted): silu(g) * u as ``swiglu`` (5); GPT-OSS's
# clamped SwiGLU: clamp g (1), clamp u (2), alpha*g (1), sigmoid (negate, +1, divide: 3), g*sig (1), u+1 (1),
# the product (1) = 10.
MOE_ACTIVATION_FLOPS = {"silu": 5, "swiglu_oai": 10, "relu2": 2}
UNGATED = ("relu2",)     # experts without a gate: up -> act -> down, two matrices (Nemotron-H's relu2)


def expert_matrices(activation: str) -> int:
    """The weight matrices of one expert: gate, up and down (3), or up and down (2) for an ``UNGATED`` one."""
    return 2 if activation in UNGATED else 3


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
      + the renormalisation 2k - 1 (k - 1 adds, k divides) with ``renorm`` + E with ``score_bias`` (ERNIE's
      correction bias added for the choice);
    * "topk_softmax" (GPT-OSS): top-k E + softmax over the k chosen 4k;
    * "sigmoid_group" (DeepSeek-V3): sigmoid 3E (negate, +1, divide) + E with ``score_bias`` (the correction
      bias added for the choice) + with ``n_group`` > 1 the group scores (E compares for each group's top-2,
      n_group adds, n_group compares to keep the best groups) + top-k E + renormalisation 2k (k - 1 adds,
      the +1e-20, k divides) with ``renorm`` + k multiplies (routed_scaling_factor);
    * "sigmoid_topk" (Llama-4): top-k of the logits E + the sigmoid of the k chosen 3k (no renormalisation).
    Bytes = logits read T*E (``logits_dtype``) + the fp32 weights and int64 ids written (12 T k) + the fp32
    score bias (E) read.
    """
    _check_moe_kind(kind)
    T, E, k = tokens, n_experts, k
    if kind == "softmax_topk":
        per = 4 * E + E + ((2 * k - 1) if renorm else 0) + (E if score_bias else 0)
    elif kind == "topk_softmax":
        per = E + 4 * k
    elif kind == "sigmoid_topk":
        per = E + 3 * k
    else:
        groups = (E + 2 * n_group) if n_group > 1 else 0
        per = 3 * E + (E if score_bias else 0) + groups + E + (2 * k if renorm else 0) + k
    nbytes = T * E * _b(logits_dtype) + 12 * T * k + (4 * E if score_bias else 0)
    return Cost(per * T, nbytes)


def router(tokens: int, hidden: int, n_experts: int, k: int, *, kind: str = "softmax_topk",
           weight_dtype: str = "bf16", act_dtype: str = "bf16", logits_dtype: str | None = None,
           gate_bias: bool = False, score_bias: bool = False, renorm: bool = True, n_group: int = 1,
           weight_bytes: float | None = None) -> Cost:
    """The whole router: the gate GEMM logits[T, E] = x[T, H] @ W[H, E] (+ b[E] with ``gate_bias``: GPT-OSS)
    then ``routing``. Two launches (``ops.linear`` then ``ops.route``): the logits (``logits_dtype``, default
    the activation dtype; DeepSeek-V3 computes them in fp32 from an fp32 gate) are written once and read
    once. FLOPs = 2*T*H*E (+ T*E bias adds) + ``routing``'s; softmax exps are not FLOPs. ``weight_bytes``: the
    gate's bytes as stored (its format's), instead of H*E in ``weight_dtype``.
    """
    ld = logits_dtype or act_dtype
    gate = gemm(tokens, hidden, n_experts, a_dtype=act_dtype, b_dtype=weight_dtype, out_dtype=ld,
                bias=n_experts if gate_bias else 0, bias_dtype=weight_dtype, b_bytes=weight_bytes)
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
    2*rows*3*H*I (2*rows*2*H*I without a gate: ``expert_matrices``) + the activation per element on rows*I + the
    routing weight multiply rows*H + the sum of each token's k partial outputs tokens*(k-1)*H (+ the biases
    rows*(2I + H), rows*(I + H) without a gate, with ``bias``)."""
    if activation not in MOE_ACTIVATION_FLOPS:
        raise ValueError(f"unknown MoE activation {activation!r}: choose one of {', '.join(MOE_ACTIVATION_FLOPS)}.")
    H, I = hidden, intermediate
    m = expert_matrices(activation)
    flops = 2 * rows * m * H * I + MOE_ACTIVATION_FLOPS[activation] * rows * I + rows * H + tokens * (k - 1) * H
    return flops + (rows * ((m - 1) * I + H) if bias else 0)


def moe_experts(tokens: int, hidden: int, intermediate: int, n_experts: int, k: int, *, distinct: float | None = None,
                activation: str = "silu", bias: bool = False, weight_dtype: str = "bf16", act_dtype: str = "bf16",
                group_size: int | None = None, zero_point: bool = False, expert_bytes: float | None = None) -> Cost:
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
    ``expert_bytes``: one expert's bytes as stored, biases included, when its format says them
    (``roofline.precision``), instead of ``moe_expert_weight_bytes``'.
    """
    T, H, I, E = tokens, hidden, intermediate, n_experts
    d = expected_distinct_experts(E, k, T) if distinct is None else float(distinct)
    if not 0 <= d <= E:
        raise ValueError(f"distinct experts must be between 0 and n_experts = {E}, got {distinct}.")
    rows = T * k
    flops = _expert_flops(rows, T, H, I, k, activation, bias)
    a = _b(act_dtype)
    weights = d * (moe_expert_weight_bytes(H, I, weight_dtype=weight_dtype, act_dtype=act_dtype, group_size=group_size,
                                           zero_point=zero_point, bias=bias) if expert_bytes is None else expert_bytes)
    nbytes = weights + 2 * T * H * a + 2 * rows * I * a + 2 * rows * H * a + 12 * rows
    return Cost(flops, nbytes)


def moe_expert_launches(tokens: int, hidden: int, intermediate: int, n_experts: int, k: int, *,
                        gate_up_bytes: float, down_bytes: float, distinct: float | None = None,
                        activation: str = "silu", bias: bool = False, act_dtype: str = "bf16") -> tuple:
    """``moe_experts`` as the two launches a fused MoE runs (vLLM's ``fused_moe_kernel`` twice, triton_kernels'
    ``matmul_ogs`` twice): (gate+up with the activation, down with the weighting and the sum), which add up to
    ``moe_experts`` exactly. ``gate_up_bytes`` / ``down_bytes``: one expert's gate+up [H, 2I] and down [I, H] as
    stored (scales and biases included).

    gate+up: FLOPs 2*T*k*2*H*I + the activation on T*k*I (+ the 2I bias adds per row); bytes: the distinct
    experts' gate+up weights + x read T*H + h written T*k*I + the routing ids (int64) 8 T k.
    down: FLOPs 2*T*k*H*I + the weight multiply T*k*H + the sum T*(k-1)*H (+ the H bias adds per row); bytes:
    the distinct experts' down weights + h read T*k*I + the partial outputs [T*k, H] written and read + y
    written T*H + the routing weights (fp32) 4 T k.
    """
    T, H, I, E = tokens, hidden, intermediate, n_experts
    d = expected_distinct_experts(E, k, T) if distinct is None else float(distinct)
    if not 0 <= d <= E:
        raise ValueError(f"distinct experts must be between 0 and n_experts = {E}, got {distinct}.")
    if activation not in MOE_ACTIVATION_FLOPS:
        raise ValueError(f"unknown MoE activation {activation!r}: choose one of {', '.join(MOE_ACTIVATION_FLOPS)}.")
    rows, a = T * k, _b(act_dtype)
    up = Cost(2 * rows * 2 * H * I + MOE_ACTIVATION_FLOPS[activation] * rows * I + (rows * 2 * I if bias else 0),
              d * gate_up_bytes + T * H * a + rows * I * a + 8 * rows)
    down = Cost(2 * rows * H * I + rows * H + T * (k - 1) * H + (rows * H if bias else 0),
                d * down_bytes + rows * I * a + 2 * rows * H * a + T * H * a + 4 * rows)
    return up, down


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
                   group_size: int | None = None, zero_point: bool = False, expert_bytes: float | None = None) -> Cost:
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
    the all-to-alls' own buffer copies are communication, not counted here. ``expert_bytes`` as ``moe_experts``.
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
    weights = d * (moe_expert_weight_bytes(H, I, weight_dtype=weight_dtype, act_dtype=act_dtype, group_size=group_size,
                                           zero_point=zero_point, bias=bias) if expert_bytes is None else expert_bytes)
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

