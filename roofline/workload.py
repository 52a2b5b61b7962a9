"""The LLM workload model: a phase (prefill or decode step) as a list of costed ops.

``prefill(cfg, batch, prompt_tokens, cached_tokens=0, chunk=None)`` and
``decode(cfg, batch, context)`` return a ``Phase`` whose ``ops`` give each op's cost for
one instance and its count per step (``n_layers`` for per-layer ops), and whose
``total`` is the whole step. With ``tp=N`` (tensor parallelism, ``roofline.parallel``) every
op is one rank's share (Megatron sharding) and ``collectives`` lists what the ranks exchange
each step; ``tp=1`` is exactly the single-device model (no collectives). With ``ep=N`` (a mixture of
experts, N = tp, or tp left at 1) each rank holds E/N whole experts and the MoE layers exchange tokens by
all-to-all instead of all-reducing (``roofline.parallel``). A request of N output tokens is one prefill and N-1 decode
steps (``request_steps``).

Shapes, per step:  T = batch x new tokens rows go through every linear layer.
Decode: ``context`` is the number of tokens already in the KV cache; the step appends
the new token and attends over context + 1 keys.
Prefill with a cached prefix: new queries at positions p..p+n-1 attend to keys
0..p+n-1 causally (n = prompt - cached). With ``chunk`` the n new tokens are processed in
chunks of at most ``chunk`` tokens, each one attending to every token before it; an
op's instance cost is then summed over the chunks (weights are read once per chunk).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import formulas as F
from .cost import ZERO, Cost
from .dtypes import bytes_per_element, normalize_dtype
from .errors import RooflineError, check_positive_int
from .models import ModelConfig
from .parallel import PER_LAYER_COLLECTIVES, Shard, ranks, shard, step_collectives

from .layer import LAYER_OP, model_ops, op_names, op_spec  # noqa: F401 (op_names, op_spec: the API)


def op_count(op: str, model) -> int:
    """Instances of ``op`` per step for ``model`` (a ModelConfig, or a layer count for the Llama layer of older
    result files): its OpSpec's count, the layer count for the layer op and the per-layer collectives of
    tensor parallelism, else 1."""
    if isinstance(model, ModelConfig):
        n_layers = model.n_layers
        for o in model_ops(model):
            if o.name == op:
                return o.count
    else:
        n_layers = int(model)
        if op in _LLAMA_LAYER_OPS:
            return n_layers
    return n_layers if op == LAYER_OP or op in PER_LAYER_COLLECTIVES else 1


# The per-layer op names of a Llama (result files written before the layer became data carry no counts).
_LLAMA_LAYER_OPS = ("attn_norm", "q_proj", "k_proj", "v_proj", "rope", "kv_append", "attention", "o_proj",
                    "attn_residual", "mlp_norm", "gate_proj", "up_proj", "swiglu", "down_proj", "mlp_residual")


@dataclass(frozen=True)
class Dtypes:
    weight: str = "bf16"
    act: str = "bf16"
    kv: str = "bf16"
    group_size: int = F.INT4_GROUP   # int4 weights: input rows per scale (formulas.weight_scale_bytes)
    zero_point: bool = False         # int4 weights: a zero point per group beside each scale
    expert_load: tuple = ()          # MoE: each expert's share of the routed slots (a histogram); (): uniform

    @property
    def weight_quant(self) -> dict:
        """The keyword arguments every linear formula takes: weight dtype, group size, zero point."""
        return dict(weight_dtype=self.weight, group_size=self.group_size, zero_point=self.zero_point)


@dataclass(frozen=True)
class OpCost:
    name: str
    cost: Cost           # one instance (one layer's op, summed over chunks if chunked)
    count: int           # instances per step
    compute_dtype: str   # the dtype whose peak applies: act dtype on tensor cores, fp32 otherwise

    @property
    def total(self) -> Cost:
        return self.cost * self.count


@dataclass(frozen=True)
class Phase:
    phase: str           # "prefill" or "decode"
    model: ModelConfig
    batch: int
    new_tokens: int      # per sequence
    context: int         # prefill: prompt length; decode: tokens already cached
    cached_tokens: int
    chunks: tuple
    dtypes: Dtypes
    ops: tuple = field(default_factory=tuple)
    tp: int = 1                  # tensor-parallel ranks: every op is one rank's share
    shard: Shard | None = None   # the per-rank sizes (roofline.parallel)
    collectives: tuple = ()      # roofline.parallel.CollectiveCost per collective of the step (none at tp=1)
    ep: int = 1                  # expert-parallel ranks (= tp when > 1): each rank E / ep whole experts

    @property
    def total(self) -> Cost:
        return sum((op.total for op in self.ops), ZERO)

    def op(self, name: str) -> OpCost:
        """An op by name; ``LAYER_OP`` is one whole layer (the per-layer ops summed, averaged over the layers
        when their windows differ), computed in the act dtype."""
        if name == LAYER_OP:
            return OpCost(LAYER_OP, self.layer_cost, self.model.n_layers, self.dtypes.act)
        for o in self.ops:
            if o.name == name:
                return o
        raise KeyError(name)

    def collective(self, name: str):
        """A collective of the step by name (``roofline.parallel.COLLECTIVE_OPS``)."""
        for c in self.collectives:
            if c.name == name:
                return c
        raise KeyError(name)

    @property
    def collective_wire_bytes(self) -> float:
        """Bytes one rank puts on the interconnect per step, every collective counted."""
        return sum(c.total_wire_bytes for c in self.collectives)

    @property
    def layer_cost(self) -> Cost:
        """One transformer layer on average: every per-layer op's instances summed, over the layer count."""
        per = [o for o in self.ops if o.name in self._layer_names]
        return sum((o.total for o in per), ZERO) * (1 / self.model.n_layers)

    @property
    def _layer_names(self) -> set:
        return {o.name for o in model_ops(self.model) if o.per_layer}

    @property
    def kv_cache_read_bytes(self) -> float:
        """Bytes of KV cache already present that the step reads, across all layers (one rank's, under tp): a
        windowed layer reads at most its window."""
        cached = self.context if self.phase == "decode" else self.cached_tokens
        m, sh = self.model, self._sizes
        if m.mla:        # the latent cache: one c_kv and one rope key per token, shared by every head
            return self.batch * F.mla_cache_bytes(cached, m.n_layers, m.kv_lora_rank, m.qk_rope_dim,
                                                  kv_dtype=self.dtypes.kv)
        return self.batch * sum(F.kv_cache_bytes(cached, 1, sh.n_kv_heads, m.head_dim, kv_dtype=self.dtypes.kv,
                                                 window=w or None) for w in m.windows)

    @property
    def weight_bytes(self) -> float:
        """Bytes of linear-layer weights the step reads (once per chunk), across all layers (one rank's, under tp),
        the scales of quantized weights included (``formulas.quantized_weight_bytes``); biases in the
        activation dtype."""
        dt = self.dtypes
        total = 0.0
        for o in model_ops(self.model, self._sizes):
            d = o.dims
            if o.kind == "linear":
                k, n = d["in_features"], d["out_features"]
                b = F.quantized_weight_bytes(k, n, act_dtype=dt.act, **dt.weight_quant)
                if d.get("bias"):
                    b += n * bytes_per_element(dt.act)
                total += b * (o.count * len(self.chunks) if o.per_layer else 1)
            elif o.kind == "mla_up" and self.phase == "prefill":   # the up-projection reads kv_b_proj as stored
                total += F.quantized_weight_bytes(*o.weights[0].shape, act_dtype=dt.act, **dt.weight_quant) * (
                    o.count * len(self.chunks))
            elif o.kind in ("router", "mla_up", "gate"):   # decode's mla_up: the copy dequantized at load (act dtype)
                w = o.weights[0].shape
                total += w[0] * w[1] * bytes_per_element(dt.act) * o.count * len(self.chunks)
        return total + self.expert_weight_bytes   # the routed experts: the distinct ones each chunk touches

    @property
    def expert_weight_bytes(self) -> float:
        """Bytes of routed-expert weights the step reads: the distinct experts each MoE layer touches, once per
        chunk (0 for a dense model)."""
        dt = self.dtypes
        total = 0.0
        for o in model_ops(self.model, self._sizes):
            if o.kind == "experts":
                d = o.dims
                one = F.moe_expert_weight_bytes(d["hidden"], d["intermediate"], act_dtype=dt.act, bias=d["bias"],
                                                **dt.weight_quant)
                total += o.count * sum(one * _rank_experts(d, self.batch * c, dt.expert_load)[1]
                                       for c in self.chunks)
        return total

    @property
    def experts_touched(self) -> float:
        """Distinct routed experts per MoE layer in this step (the last chunk's), in expectation; 0 when dense.
        Under expert parallelism: among one rank's E / ep (the busiest rank's under a skewed load)."""
        for o in model_ops(self.model, self._sizes):
            if o.kind == "experts":
                return _rank_experts(o.dims, self.batch * self.chunks[-1], self.dtypes.expert_load)[1]
        return 0.0

    @property
    def _sizes(self) -> Shard:
        return self.shard or shard(self.model, 1)


INT4_GROUPS = (32, 64, 128)   # the int4 group sizes the kernels run (kernels/linear_int4.py)


def _check_dtypes(weight_dtype, act_dtype, kv_dtype, group_size=None, zero_point=False, expert_load=()) -> Dtypes:
    act = normalize_dtype(act_dtype)
    if act not in ("fp32", "bf16", "fp16"):
        raise RooflineError(f"activation dtype must be fp32, bf16 or fp16, not {act_dtype!r}.")
    g = F.INT4_GROUP if group_size is None else group_size
    if isinstance(g, bool) or not isinstance(g, int) or g not in INT4_GROUPS:
        raise RooflineError(f"the int4 group size must be one of {', '.join(map(str, INT4_GROUPS))}, "
                            f"but {group_size!r} was given.")
    return Dtypes(normalize_dtype(weight_dtype), act, normalize_dtype(kv_dtype), g, bool(zero_point),
                  _check_load(expert_load))


def _check_load(load) -> tuple:
    """An expert histogram (counts or shares, one per expert) as shares summing to 1; () for uniform."""
    if load is None or len(load) == 0:
        return ()
    try:
        v = [float(x) for x in load]
    except (TypeError, ValueError):
        raise RooflineError(f"the expert load must be numbers, one per expert, but {load!r} was given.") from None
    total = sum(v)
    if any(not x >= 0 for x in v) or not total > 0:
        raise RooflineError("the expert load must be counts or shares, each >= 0 and not all 0: give one per expert.")
    return tuple(x / total for x in v)


def _op_cost(o, dt: Dtypes, T: int, batch: int, c: int, p: int, decode: bool) -> Cost:
    """One instance of the per-layer op ``o`` for a chunk of ``c`` new tokens per sequence after ``p`` cached
    (decode: c = 1, p = context); T = batch * c rows."""
    a, kv, d = dt.act, dt.kv, o.dims
    k = o.kind
    if k == "linear":
        return F.linear(T, d["in_features"], d["out_features"], act_dtype=a, bias=d["bias"], **dt.weight_quant)
    if k == "norm":
        return F.rmsnorm(T * d["rows"], d["width"], act_dtype=a, weight_dtype=a)
    if k == "rope":
        return F.rope(T, d["n_heads"], d["n_kv_heads"], d["head_dim"], act_dtype=a)
    if k == "kv_append":
        return F.kv_append(T, d["n_kv_heads"], d["head_dim"], act_dtype=a, kv_dtype=kv)
    if k == "attention":
        w = d["window"] or None
        if decode:
            return F.decode_attention(batch, p + 1, d["n_heads"], d["n_kv_heads"], d["head_dim"], window=w,
                                      act_dtype=a, kv_dtype=kv)
        return F.prefill_attention(batch, c, d["n_heads"], d["n_kv_heads"], d["head_dim"], cached_tokens=p,
                                   window=w, act_dtype=a, kv_dtype=kv)
    if k == "residual":
        return F.residual_add(T, d["width"], act_dtype=a)
    if k == "activation":
        return (F.swiglu if d["fn"] == "silu" else F.geglu)(T, d["width"], act_dtype=a)
    if k == "router":   # the gate GEMM's weights stay in the activation dtype (never quantized)
        return F.router(T, d["in_features"], d["n_experts"], d["k"], kind=d["kind"], weight_dtype=a, act_dtype=a,
                        gate_bias=any(w.key == "router_bias" for w in o.weights),
                        score_bias=any(w.key == "router_correction" for w in o.weights),
                        renorm=d.get("renorm", True), n_group=d.get("n_group", 1))
    if k == "experts" and d.get("ep", 1) > 1:   # expert parallel: this rank's routed rows and its experts
        rows, distinct = _rank_experts(d, T, dt.expert_load)
        return F.moe_experts_ep(T, d["hidden"], d["intermediate"], d["n_experts"], d["k"], d["ep"], rows=rows,
                                distinct=distinct, activation=d["activation"], bias=d["bias"], act_dtype=a,
                                **dt.weight_quant)
    if k == "experts":
        return F.moe_experts(T, d["hidden"], d["intermediate"], d["n_experts"], d["k"],
                             distinct=distinct_experts(d["n_experts"], d["k"], T, dt.expert_load),
                             activation=d["activation"], bias=d["bias"], act_dtype=a, **dt.weight_quant)
    if k == "gate":     # Qwen2-MoE's shared-expert gate: sigmoid(x w) [T, 1] times the shared output [T, H]
        return (F.linear(T, d["in_features"], 1, act_dtype=a, weight_dtype=a)
                + F.elementwise(T * d["width"], ((T * d["width"], a), (T, a)), out_dtype=a, flops_per_element=1))
    if k == "latent_append":
        return F.copy(T * d["width"], src_dtype=a, dst_dtype=kv)
    # decode: absorbed into the query and output, W_UK / W_UV read in the activation dtype (a quantized kv_b_proj is
    # dequantized once at load: kernels.quant.absorbed_kv_b); prefill: every key up-projected by kv_b_proj as stored
    if k == "mla_up":
        H_, R, N, V = d["n_heads"], d["rank"], d["nope"], d["v"]
        if decode:
            w = R * H_ * (N + V) * bytes_per_element(dt.weight if dt.weight in ("bf16", "fp16", "fp32") else a)
            io = T * H_ * (N + R + R + V) * bytes_per_element(a)
            return Cost(F.mla_absorb_flops(T, H_, N, V, R), w + io)
        return F.linear(batch * (p + c), R, H_ * (N + V), act_dtype=a, **dt.weight_quant)
    if k == "mla_attention":
        if decode:
            return F.mla_decode_attention(batch, p + 1, d["n_heads"], d["rank"], d["rope"], act_dtype=a, kv_dtype=kv)
        return F.mla_prefill_attention(batch, c, d["n_heads"], d["nope"], d["rope"], d["v"], cached_tokens=p,
                                       kv_lora_rank=d["rank"], act_dtype=a, kv_dtype=kv)
    raise ValueError(f"op {o.name!r} of kind {k!r} has no per-layer cost")


def distinct_experts(n_experts: int, k: int, tokens: int, load=()) -> float:
    """Experts a step of ``tokens`` routed tokens touches per MoE layer, in expectation: uniform routing, or
    ``load`` (each expert's share of the routed slots: a skew or a measured histogram)
    (``formulas.expected_distinct_experts``)."""
    try:
        return F.expected_distinct_experts(n_experts, k, tokens, skew=list(load) if load else None)
    except ValueError as e:   # a histogram that no top-k routing can produce, or of the wrong length
        raise RooflineError(f"expert load: {e}") from None


def _rank_experts(d: dict, tokens: int, load=()) -> tuple:
    """(routed rows, distinct experts) of one rank's experts op for a step of ``tokens`` tokens: all T*k rows and
    ``distinct_experts`` of all E, or under expert parallelism the busiest rank's (``formulas.moe_rank_load``)."""
    ep = d.get("ep", 1)
    if ep > 1:
        return F.moe_rank_load(d["n_experts"], d["k"], tokens, ep, skew=list(load) if load else None)
    return tokens * d["k"], distinct_experts(d["n_experts"], d["k"], tokens, load)


def _edge_cost(o, dt: Dtypes, T_all: int, batch: int, tp: int) -> Cost:
    """One instance of a pre- or post-layer op: the embedding over every new token; the final norm, lm_head
    and logit softcap over one row per sequence (only the last position needs logits)."""
    a, d = dt.act, o.dims
    if o.kind == "embedding":
        return F.embedding(T_all, d["hidden"], weight_dtype=a, act_dtype=a, vocab_shards=tp)
    if o.kind == "scale":
        e = T_all * d["width"]
        return F.elementwise(e, ((e, a),), out_dtype=a)
    if o.kind == "norm":
        return F.rmsnorm(batch, d["width"], act_dtype=a, weight_dtype=a)
    if o.kind == "linear":   # lm_head is vocab-parallel: each rank computes its V/N logits (of the padded vocab)
        return F.lm_head(batch, d["in_features"], d["out_features"], act_dtype=a, **dt.weight_quant)
    if o.kind == "softcap":  # c * tanh(x / c): a divide and a multiply; tanh, like exp, is not counted
        e = batch * d["width"]
        return F.elementwise(e, ((e, a),), out_dtype=a, flops_per_element=2)
    raise ValueError(f"op {o.name!r} of kind {o.kind!r} has no pre/post-layer cost")


def _assemble(phase, cfg, dt, batch, new_tokens, context, cached, chunks, prior, decode, tp=1, ep=1) -> Phase:
    tp, ep = ranks(tp, ep)
    sh = shard(cfg, tp, ep)
    ops = []
    for o in model_ops(cfg, sh):
        cdt = dt.act if o.tensor else "fp32"
        if not o.per_layer:
            ops.append(OpCost(o.name, _edge_cost(o, dt, batch * new_tokens, batch, tp), 1, cdt))
            continue
        acc, p = ZERO, prior            # one instance, summed over the chunks (weights read once per chunk)
        for c in chunks:
            acc = acc + _op_cost(o, dt, batch * c, batch, c, p, decode)
            p += c
        ops.append(OpCost(o.name, acc, o.count, cdt))
    return Phase(phase, cfg, batch, new_tokens, context, cached, tuple(chunks), dt, tuple(ops), tp, sh,
                 step_collectives(cfg, sh, batch, chunks, dt.act), ep)


def prefill(cfg: ModelConfig, batch: int, prompt_tokens: int, cached_tokens: int = 0, chunk: int | None = None,
            *, weight_dtype="bf16", act_dtype="bf16", kv_dtype="bf16", tp: int = 1, group_size: int | None = None,
            zero_point: bool = False, expert_load=(), ep: int = 1) -> Phase:
    """The prompt-processing work of ``batch`` prompts of ``prompt_tokens`` tokens (one rank's, over ``tp``).

    ``group_size`` / ``zero_point``: int4 weights' groups (default 128) and zero points (formulas.linear)."""
    batch = check_positive_int("batch", batch)
    prompt_tokens = check_positive_int("prompt length (--context)", prompt_tokens)
    cached_tokens = check_positive_int("cached prefix (--cached)", cached_tokens, allow_zero=True)
    if cached_tokens >= prompt_tokens:
        raise RooflineError(f"the cached prefix ({cached_tokens}) must be shorter than the prompt "
                            f"({prompt_tokens}): at least the last prompt token is always recomputed.")
    if prompt_tokens > cfg.max_context:
        raise RooflineError(f"the prompt ({prompt_tokens} tokens) is longer than {cfg.name}'s maximum "
                            f"context of {cfg.max_context}.")
    new = prompt_tokens - cached_tokens
    if chunk is None:
        chunks = [new]
    else:
        chunk = check_positive_int("chunk (--chunk)", chunk)
        if chunk > prompt_tokens:
            raise RooflineError(f"the chunk ({chunk}) is larger than the prompt ({prompt_tokens}); "
                                "use a chunk no larger than the prompt, or no --chunk.")
        chunks = [chunk] * (new // chunk) + ([new % chunk] if new % chunk else [])
    dt = _check_dtypes(weight_dtype, act_dtype, kv_dtype, group_size, zero_point, expert_load)
    return _assemble("prefill", cfg, dt, batch, new, prompt_tokens, cached_tokens, chunks, cached_tokens, False, tp,
                     ep)


def decode(cfg: ModelConfig, batch: int, context: int, *, weight_dtype="bf16", act_dtype="bf16",
           kv_dtype="bf16", tp: int = 1, group_size: int | None = None, zero_point: bool = False,
           expert_load=(), ep: int = 1) -> Phase:
    """One decode step: each of ``batch`` sequences has ``context`` cached tokens and adds one (one rank's
    share over ``tp`` ranks)."""
    batch = check_positive_int("batch", batch)
    context = check_positive_int("context (--context)", context)
    if context + 1 > cfg.max_context:
        raise RooflineError(f"a decode step at context {context} needs {context + 1} positions, past "
                            f"{cfg.name}'s maximum context of {cfg.max_context}.")
    dt = _check_dtypes(weight_dtype, act_dtype, kv_dtype, group_size, zero_point, expert_load)
    return _assemble("decode", cfg, dt, batch, 1, context, 0, [1], context, True, tp, ep)


def request_steps(output_tokens: int) -> tuple[int, int]:
    """(prefill steps, decode steps) for a request of ``output_tokens`` ordinary output tokens.

    Prefill predicts the first token; every later token needs one decode step that
    consumes the previous one. N tokens: 1 prefill + N-1 decode (N=1: no decode step).
    """
    n = check_positive_int("output tokens", output_tokens)
    return 1, n - 1
