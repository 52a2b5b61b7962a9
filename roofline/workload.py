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

Each op is costed by its kind's registry entry (``roofline.ops``): ``cost`` per chunk for a per-layer op,
``edge_cost`` for a pre- or post-layer one, ``weight_bytes`` for the step's weight traffic, each given a
``StepContext`` (the dtypes, the chunk's rows, batch, chunk, cached prefix, decode or not, tp). Nothing here
branches on a kind: a kind registered elsewhere is costed as soon as a model's ops use it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from . import formulas as F
from .cost import ZERO, Cost
from .dtypes import normalize_dtype
from .errors import RooflineError, check_positive_int
from .models import ModelConfig
from .ops import Dtypes, StepContext, kind
from .parallel import PER_LAYER_COLLECTIVES, Shard, ranks, shard, step_collectives
from .precision import Precision, kv_format, lookup, plain
from .precision.modules import WEIGHT_ROLES

from .capacity import layer_states
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
        if op in LLAMA_LAYER_OPS:
            return n_layers
    return n_layers if op == LAYER_OP or op in PER_LAYER_COLLECTIVES else 1


# A Llama's ops and their kinds, in the order they run: what a result file written before the layer became data
# (no model description, no counts) was measured with.
LLAMA_LAYER_OPS = {"attn_norm": "norm", "q_proj": "linear", "k_proj": "linear", "v_proj": "linear", "rope": "rope",
                   "kv_append": "kv_append", "attention": "attention", "o_proj": "linear", "attn_residual": "residual",
                   "mlp_norm": "norm", "gate_proj": "linear", "up_proj": "linear", "swiglu": "activation",
                   "down_proj": "linear", "mlp_residual": "residual"}
LLAMA_OPS = {"embedding": "embedding", **LLAMA_LAYER_OPS, "final_norm": "norm", "lm_head": "linear"}


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
    phase: str           # "prefill", "decode" or "mixed" (``mixed``: batch = sequences, new_tokens = rows)
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
        windowed layer reads at most its window, a chunked one the keys of its current chunk, a DeepSeek Sparse
        Attention decode step its top-k (``selected_tokens``; the indexer's own keys: ``index_read_bytes``)."""
        cached = self.context if self.phase == "decode" else self.cached_tokens
        m, sh = self.model, self._sizes
        if m.mla:        # the latent cache: one c_kv and one rope key per token, shared by every head
            return self.batch * F.mla_cache_bytes(self.selected_tokens, m.n_layers, m.kv_lora_rank, m.qk_rope_dim,
                                                  kv_dtype=self.dtypes.kv)
        windows, chunks = m.windows, m.chunks    # DeltaNet and Mamba-2 layers read no KV: ``state_read_bytes``
        return self.batch * sum(F.kv_cache_bytes(F.chunk_keys(cached, chunks[i]) if chunks[i] else cached, 1,
                                                 sh.n_kv_heads, m.head_dim, kv_dtype=self.dtypes.kv,
                                                 kv_scales=self.dtypes.kv_scales, window=windows[i] or None)
                                for i in m.attention_layers)   # a chunked layer reads its current chunk

    @property
    def selected_tokens(self) -> int:
        """Cached tokens per sequence whose KV the step reads in each attention layer: a decode step under DeepSeek
        Sparse Attention reads min(context, index_topk) of them, the latents its indexer selected (counted as
        cached rows, though the new token's own may be among the top-k); a prefill chunk expands its whole cached
        prefix (``formulas.mla``); otherwise the whole context."""
        cached = self.context if self.phase == "decode" else self.cached_tokens
        return min(cached, self.model.index_topk) if self.model.index_topk and self.phase == "decode" else cached

    @property
    def index_read_bytes(self) -> float:
        """Bytes of the DeepSeek Sparse Attention indexer's key cache the step reads: every cached key of every
        indexer layer, once per sequence (fp8 + scales: ``formulas.dsa.index_key_bytes``), whatever the top-k;
        0 without an indexer."""
        m = self.model
        cached = self.context if self.phase == "decode" else self.cached_tokens
        if not m.index_topk:
            return 0.0
        return self.batch * F.index_cache_bytes(cached, len(m.index_layers), m.index_head_dim)

    @property
    def state_read_bytes(self) -> float:
        """Bytes of Gated DeltaNet and Mamba-2 state the step reads (``state_read_by_kind``)."""
        return sum(b for _, _, b in self.state_read_by_kind)

    @property
    def state_read_by_kind(self) -> tuple:
        """(kind, layers, bytes) of the state the step reads per kind of stateful layer (the recurrent or SSM state
        in fp32 and the conv state, once per sequence and layer, when the sequences have one: decode or cached
        tokens: ``capacity.layer_states``), whatever the context; () for a model without such layers."""
        cached = self.context if self.phase == "decode" else self.cached_tokens
        states = layer_states(self.model, act_dtype=self.dtypes.act)
        return tuple((k, n, self.batch * b if cached else 0.0) for k, n, b in states)

    @property
    def weight_bytes(self) -> float:
        """Bytes of weights the step reads (once per chunk), across all layers (one rank's, under tp): each op's
        kind's ``weight_bytes`` (linear layers: the scales of quantized weights included,
        ``formulas.quantized_weight_bytes``, biases in the activation dtype), the routed experts last."""
        return self._weights(routed=False) + self.expert_weight_bytes

    @property
    def expert_weight_bytes(self) -> float:
        """Bytes of routed-expert weights the step reads: the distinct experts each MoE layer touches, once per
        chunk (0 for a dense model)."""
        return self._weights(routed=True)

    def _weights(self, routed: bool) -> float:
        """Weight bytes of the ops whose kind routes experts (``routed``) or of the others: per-layer ops once
        per chunk and layer, the others once."""
        steps, edge = self.steps, self.edge_step
        total = 0.0
        for o in model_ops(self.model, self._sizes):
            k = kind(o.kind)
            if (k.experts is not None) != routed:
                continue
            if o.per_layer:
                total += o.count * sum(k.weight_bytes(o, s) for s in steps)
            else:
                total += k.weight_bytes(o, edge)
        return total

    @property
    def experts_touched(self) -> float:
        """Distinct routed experts per MoE layer in this step (the last chunk's), in expectation; 0 when dense.
        Under expert parallelism: among one rank's E / ep (the busiest rank's under a skewed load)."""
        for o in model_ops(self.model, self._sizes):
            k = kind(o.kind)
            if k.experts is not None:
                return k.experts(o, self.steps[-1])[1]
        return 0.0

    @property
    def per_expert_bytes(self) -> float:
        """One routed expert's weights over every MoE layer, as this step reads them (0 when dense)."""
        touched = self.experts_touched
        return self.expert_weight_bytes / touched if touched > 0 else 0.0

    @property
    def dense_equivalent_bytes(self) -> float:
        """The weight bytes a dense model of the same active size reads: every non-expert weight once and k experts
        per MoE layer (what the step would read if routing touched no more experts than each token uses)."""
        return self.weight_bytes - self.expert_weight_bytes + self.model.n_active * self.per_expert_bytes

    @property
    def steps(self) -> tuple:
        """The ``StepContext`` of each chunk, in order (decode: one, after the context)."""
        prior = self.context if self.phase == "decode" else self.cached_tokens
        return chunk_steps(self.dtypes, self.batch, self.chunks, prior, self.phase == "decode", self.tp)

    @property
    def edge_step(self) -> StepContext:
        """The ``StepContext`` of the ops before and after the layers: every new token of the step at once."""
        prior = self.context if self.phase == "decode" else self.cached_tokens
        return edge_step(self.dtypes, self.batch, self.new_tokens, prior, self.phase == "decode", self.tp)

    @property
    def _sizes(self) -> Shard:
        return self.shard or shard(self.model, 1)


INT4_GROUPS = (32, 64, 128)   # the int4 group sizes the kernels run (kernels/linear_int4.py)


def _check_dtypes(weight_dtype, act_dtype, kv_dtype, group_size=None, zero_point=False, expert_load=(),
                  precision: Precision | None = None) -> Dtypes:
    """The step's ``Dtypes``: ``precision`` (each module's formats: the checkpoint's with the flags over it,
    ``roofline.precision``) or, without one, a plain ``weight_dtype`` for every projection, MLP, expert and
    lm_head (``precision.plain``); the KV cache the precision's, else ``kv_dtype`` (a registered KV format)."""
    act = normalize_dtype(act_dtype)
    if act not in ("fp32", "bf16", "fp16"):
        raise RooflineError(f"activation dtype must be fp32, bf16 or fp16, not {act_dtype!r}.")
    g = F.INT4_GROUP if group_size is None else group_size
    if isinstance(g, bool) or not isinstance(g, int) or g not in INT4_GROUPS:
        raise RooflineError(f"the int4 group size must be one of {', '.join(map(str, INT4_GROUPS))}, "
                            f"but {group_size!r} was given.")
    if precision is None:        # a format name, or a point key's module=format pairs (``plain`` refuses the rest)
        weight = str(weight_dtype).strip() if "=" in str(weight_dtype) else lookup(weight_dtype, "weight").name
        precision = plain(weight, group_size=g, zero_point=zero_point)
    else:
        weight = str(weight_dtype)
    if precision.kv is None:
        precision = replace(precision, kv=kv_format(kv_dtype))
    return Dtypes(weight, act, precision.kv_dtype(act), g, bool(zero_point), _check_load(expert_load), precision,
                  precision.kv_scales)


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


def chunk_steps(dt: Dtypes, batch: int, chunks, prior: int, decode: bool, tp: int = 1) -> tuple:
    """One ``StepContext`` per chunk of ``c`` new tokens per sequence, each after the ``prior`` cached tokens and
    the chunks before it (decode: one chunk of 1 after the context); T = batch * c rows."""
    out, p = [], prior
    for c in chunks:
        out.append(StepContext(dt, batch * c, batch, c, p, decode, tp))
        p += c
    return tuple(out)


def edge_step(dt: Dtypes, batch: int, new_tokens: int, prior: int, decode: bool, tp: int = 1) -> StepContext:
    """The ``StepContext`` of a pre- or post-layer op: the embedding gathers every new token; the final norm,
    lm_head and logit softcap see one row per sequence (only the last position needs logits)."""
    return StepContext(dt, batch * new_tokens, batch, new_tokens, prior, decode, tp)


def _op_cost(o, steps: tuple) -> Cost:
    """One instance of the per-layer op ``o``, summed over the chunks (weights read once per chunk)."""
    k, acc = kind(o.kind), ZERO
    for s in steps:
        acc = acc + k.layer_cost(o, s)
    return acc


def _edge_cost(o, step: StepContext) -> Cost:
    """One instance of a pre- or post-layer op."""
    return kind(o.kind).pre_post_cost(o, step)


def _assemble(phase, cfg, dt, batch, new_tokens, context, cached, chunks, prior, decode, tp=1, ep=1) -> Phase:
    tp, ep = ranks(tp, ep)
    sh = shard(cfg, tp, ep)
    steps = chunk_steps(dt, batch, chunks, prior, decode, tp)
    edge = edge_step(dt, batch, new_tokens, prior, decode, tp)
    ops = []
    for o in model_ops(cfg, sh):
        cdt = (dt.precision.compute(o, dt.act) if any(w.role in WEIGHT_ROLES for w in o.weights) else dt.act) \
            if kind(o.kind).tensor else "fp32"
        if o.per_layer:
            ops.append(OpCost(o.name, _op_cost(o, steps), o.count, cdt))
        else:
            ops.append(OpCost(o.name, _edge_cost(o, edge), 1, cdt))
    return Phase(phase, cfg, batch, new_tokens, context, cached, tuple(chunks), dt, tuple(ops), tp, sh,
                 step_collectives(cfg, sh, batch, chunks, dt.act), ep)


def prefill(cfg: ModelConfig, batch: int, prompt_tokens: int, cached_tokens: int = 0, chunk: int | None = None,
            *, weight_dtype="bf16", act_dtype="bf16", kv_dtype="bf16", tp: int = 1, group_size: int | None = None,
            zero_point: bool = False, expert_load=(), ep: int = 1, precision: Precision | None = None) -> Phase:
    """The prompt-processing work of ``batch`` prompts of ``prompt_tokens`` tokens (one rank's, over ``tp``).

    ``group_size`` / ``zero_point``: int4 weights' groups (default 128) and zero points (formulas.linear).
    ``precision``: each module's formats (``roofline.precision``; e.g. the checkpoint's,
    ``roofline.layer.precision_of``, with the flags over it) instead of one ``weight_dtype`` for every linear;
    ``weight_dtype`` is then only its label."""
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
    dt = _check_dtypes(weight_dtype, act_dtype, kv_dtype, group_size, zero_point, expert_load, precision)
    return _assemble("prefill", cfg, dt, batch, new, prompt_tokens, cached_tokens, chunks, cached_tokens, False, tp,
                     ep)


def decode(cfg: ModelConfig, batch: int, context: int, *, weight_dtype="bf16", act_dtype="bf16",
           kv_dtype="bf16", tp: int = 1, group_size: int | None = None, zero_point: bool = False,
           expert_load=(), ep: int = 1, precision: Precision | None = None) -> Phase:
    """One decode step: each of ``batch`` sequences has ``context`` cached tokens and adds one (one rank's
    share over ``tp`` ranks); ``precision`` as ``prefill``'s."""
    batch = check_positive_int("batch", batch)
    context = check_positive_int("context (--context)", context)
    if context + 1 > cfg.max_context:
        raise RooflineError(f"a decode step at context {context} needs {context + 1} positions, past "
                            f"{cfg.name}'s maximum context of {cfg.max_context}.")
    dt = _check_dtypes(weight_dtype, act_dtype, kv_dtype, group_size, zero_point, expert_load, precision)
    return _assemble("decode", cfg, dt, batch, 1, context, 0, [1], context, True, tp, ep)


def mixed(cfg: ModelConfig, chunks=(), decodes=(), *, weight_dtype="bf16", act_dtype="bf16", kv_dtype="bf16",
          tp: int = 1, group_size: int | None = None, zero_point: bool = False, expert_load=(), ep: int = 1,
          precision: Precision | None = None, logits: int | None = None) -> Phase:
    """One continuous-batching step (a serving engine's mixed step): ``chunks`` = (new tokens, cached tokens) per
    prefill chunk, ``decodes`` = (sequences, keys each attends over, its new one included) per decode group. Every
    op whose cost depends only on its rows (linears, norms, the experts, pointwise, rope, the cache writes) runs
    once on all T = chunks' new tokens + one per decode sequence rows (its weights read once); an attention kind
    (``OpKind.per_sequence``: attention, MLA's up-projection and attention) is costed per chunk over its prefix and
    per decode group over its own context, summed. The embedding gathers T rows; the final norm, lm_head and
    softcap see one row per sequence, or ``logits`` rows (a speculative verify step needs every position's: k + 1
    per sequence, ``roofline.speculative``). Dtypes and ``precision`` as ``prefill``'s; ``phase`` is "mixed"."""
    chunks = tuple((int(q), int(c)) for q, c in chunks)
    decodes = tuple((int(n), int(k)) for n, k in decodes)
    bad = [x for x in chunks if x[0] < 1 or x[1] < 0] + [x for x in decodes if x[0] < 1 or x[1] < 1]
    if bad or not (chunks or decodes):
        raise RooflineError(f"a mixed step needs prefill chunks (new >= 1 tokens after cached >= 0) and decode "
                            f"groups (sequences >= 1 over keys >= 1), at least one of them; got {bad or 'none'}.")
    longest = max([q + c for q, c in chunks] + [k for _, k in decodes])
    if longest > cfg.max_context:
        raise RooflineError(f"a mixed step's longest sequence ({longest} tokens) is past {cfg.name}'s maximum "
                            f"context of {cfg.max_context}.")
    dt = _check_dtypes(weight_dtype, act_dtype, kv_dtype, group_size, zero_point, expert_load, precision)
    tp, ep = ranks(tp, ep)
    sh = shard(cfg, tp, ep)
    sequences = len(chunks) + sum(n for n, _ in decodes)
    rows = sum(q for q, _ in chunks) + sum(n for n, _ in decodes)
    groups = tuple(StepContext(dt, q, 1, q, c, False, tp) for q, c in chunks) + \
        tuple(StepContext(dt, n, n, 1, k - 1, True, tp) for n, k in decodes)
    whole = StepContext(dt, rows, sequences, 0, 0, not chunks, tp)
    edge = whole if logits is None else replace(whole, batch=check_positive_int("logits rows", logits))
    ops = []
    for o in model_ops(cfg, sh):
        k = kind(o.kind)
        cdt = (dt.precision.compute(o, dt.act) if any(w.role in WEIGHT_ROLES for w in o.weights) else dt.act) \
            if k.tensor else "fp32"
        if o.per_layer:
            ops.append(OpCost(o.name, _op_cost(o, groups if k.per_sequence else (whole,)), o.count, cdt))
        else:
            ops.append(OpCost(o.name, _edge_cost(o, edge), 1, cdt))
    return Phase("mixed", cfg, sequences, rows, longest, 0, (rows,), dt, tuple(ops), tp, sh,
                 step_collectives(cfg, sh, 1, (rows,), dt.act), ep)


def request_steps(output_tokens: int) -> tuple[int, int]:
    """(prefill steps, decode steps) for a request of ``output_tokens`` ordinary output tokens.

    Prefill predicts the first token; every later token needs one decode step that
    consumes the previous one. N tokens: 1 prefill + N-1 decode (N=1: no decode step).
    """
    n = check_positive_int("output tokens", output_tokens)
    return 1, n - 1
