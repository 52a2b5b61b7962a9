"""The LLM workload model: a phase (prefill or decode step) as a list of costed ops.

``prefill(cfg, batch, prompt_tokens, cached_tokens=0, chunk=None)`` and
``decode(cfg, batch, context)`` return a ``Phase`` whose ``ops`` give each op's cost for
one instance and its count per step (``n_layers`` for per-layer ops), and whose
``total`` is the whole step. With ``tp=N`` (tensor parallelism, ``roofline.parallel``) every
op is one rank's share (Megatron sharding) and ``collectives`` lists what the ranks exchange
each step; ``tp=1`` is exactly the single-device model (no collectives). A request of N output tokens is one prefill and N-1 decode
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
from .dtypes import normalize_dtype
from .errors import RooflineError, check_positive_int
from .models import ModelConfig
from .parallel import PER_LAYER_COLLECTIVES, Shard, shard, step_collectives

PER_LAYER_OPS = ("attn_norm", "q_proj", "k_proj", "v_proj", "rope", "kv_append", "attention", "o_proj",
                 "attn_residual", "mlp_norm", "gate_proj", "up_proj", "swiglu", "down_proj", "mlp_residual")
OP_NAMES = ("embedding",) + PER_LAYER_OPS + ("final_norm", "lm_head")
LINEAR_OPS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head")
TENSOR_OPS = LINEAR_OPS + ("attention",)  # run on tensor cores; the rest on vector units (fp32 peak)
LAYER_OP = "layer"   # one whole transformer layer timed as one op: the sum of PER_LAYER_OPS


def op_count(op: str, n_layers: int) -> int:
    """Instances of ``op`` per step: ``n_layers`` for per-layer ops, the layer op and the per-layer
    collectives of tensor parallelism, else 1."""
    return int(n_layers) if op in PER_LAYER_OPS or op == LAYER_OP or op in PER_LAYER_COLLECTIVES else 1


@dataclass(frozen=True)
class Dtypes:
    weight: str = "bf16"
    act: str = "bf16"
    kv: str = "bf16"
    group_size: int = F.INT4_GROUP   # int4 weights: input rows per scale (formulas.weight_scale_bytes)
    zero_point: bool = False         # int4 weights: a zero point per group beside each scale

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

    @property
    def total(self) -> Cost:
        return sum((op.total for op in self.ops), ZERO)

    def op(self, name: str) -> OpCost:
        """An op by name; ``LAYER_OP`` is one whole layer (the per-layer ops summed), computed in the act dtype."""
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
        """One transformer layer: the sum of every per-layer op's instance cost."""
        return sum((o.cost for o in self.ops if o.name in PER_LAYER_OPS), ZERO)

    @property
    def kv_cache_read_bytes(self) -> float:
        """Bytes of KV cache already present that the step reads, across all layers (one rank's, under tp)."""
        cached = self.context if self.phase == "decode" else self.cached_tokens
        m, sh = self.model, self._sizes
        return self.batch * F.kv_cache_bytes(cached, m.n_layers, sh.n_kv_heads, m.head_dim, kv_dtype=self.dtypes.kv)

    @property
    def weight_bytes(self) -> float:
        """Bytes of linear-layer weights the step reads (once per chunk), across all layers (one rank's, under tp),
        the scales of quantized weights included (``formulas.quantized_weight_bytes``)."""
        m, sh, dt = self.model, self._sizes, self.dtypes
        wb = lambda k, n: F.quantized_weight_bytes(k, n, act_dtype=dt.act, **dt.weight_quant)  # noqa: E731
        per_layer = (wb(m.hidden, sh.q_dim) + 2 * wb(m.hidden, sh.kv_dim) + wb(sh.q_dim, m.hidden)
                     + 2 * wb(m.hidden, sh.intermediate) + wb(sh.intermediate, m.hidden))
        return per_layer * m.n_layers * len(self.chunks) + wb(m.hidden, sh.vocab)

    @property
    def _sizes(self) -> Shard:
        return self.shard or shard(self.model, 1)


INT4_GROUPS = (32, 64, 128)   # the int4 group sizes the kernels run (kernels/linear_int4.py)


def _check_dtypes(weight_dtype, act_dtype, kv_dtype, group_size=None, zero_point=False) -> Dtypes:
    act = normalize_dtype(act_dtype)
    if act not in ("fp32", "bf16", "fp16"):
        raise RooflineError(f"activation dtype must be fp32, bf16 or fp16, not {act_dtype!r}.")
    g = F.INT4_GROUP if group_size is None else group_size
    if isinstance(g, bool) or not isinstance(g, int) or g not in INT4_GROUPS:
        raise RooflineError(f"the int4 group size must be one of {', '.join(map(str, INT4_GROUPS))}, "
                            f"but {group_size!r} was given.")
    return Dtypes(normalize_dtype(weight_dtype), act, normalize_dtype(kv_dtype), g, bool(zero_point))


def _layer_ops(cfg: ModelConfig, sh: Shard, dt: Dtypes, batch: int, chunks, prior: int, decode: bool):
    """Per-layer op costs summed over chunks (one rank's share of each over ``sh.tp`` ranks): {name: Cost}."""
    H, I, D = cfg.hidden, sh.intermediate, cfg.head_dim
    Hq, Hkv = sh.n_heads, sh.n_kv_heads
    a, kv = dt.act, dt.kv
    acc = {n: ZERO for n in PER_LAYER_OPS}
    p = prior
    for c in chunks:
        T = batch * c
        lin = lambda k, n: F.linear(T, k, n, act_dtype=a, **dt.weight_quant)  # noqa: E731
        if decode:
            attn = F.decode_attention(batch, p + 1, Hq, Hkv, D, act_dtype=a, kv_dtype=kv)
        else:
            attn = F.prefill_attention(batch, c, Hq, Hkv, D, cached_tokens=p, act_dtype=a, kv_dtype=kv)
        step = {
            "attn_norm": F.rmsnorm(T, H, act_dtype=a, weight_dtype=a),
            "q_proj": lin(H, sh.q_dim), "k_proj": lin(H, sh.kv_dim), "v_proj": lin(H, sh.kv_dim),
            "rope": F.rope(T, Hq, Hkv, D, act_dtype=a),
            "kv_append": F.kv_append(T, Hkv, D, act_dtype=a, kv_dtype=kv),
            "attention": attn,
            "o_proj": lin(sh.q_dim, H),
            "attn_residual": F.residual_add(T, H, act_dtype=a),
            "mlp_norm": F.rmsnorm(T, H, act_dtype=a, weight_dtype=a),
            "gate_proj": lin(H, I), "up_proj": lin(H, I),
            "swiglu": F.swiglu(T, I, act_dtype=a),
            "down_proj": lin(I, H),
            "mlp_residual": F.residual_add(T, H, act_dtype=a),
        }
        for n in PER_LAYER_OPS:
            acc[n] = acc[n] + step[n]
        p += c
    return acc


def _assemble(phase, cfg, dt, batch, new_tokens, context, cached, chunks, prior, decode, tp=1) -> Phase:
    sh = shard(cfg, tp)
    layer = _layer_ops(cfg, sh, dt, batch, chunks, prior, decode)
    T_all = batch * new_tokens
    vec = "fp32"
    ops = [OpCost("embedding", F.embedding(T_all, cfg.hidden, weight_dtype=dt.act, act_dtype=dt.act,
                                           vocab_shards=tp), 1, vec)]
    for n in PER_LAYER_OPS:
        ops.append(OpCost(n, layer[n], cfg.n_layers, dt.act if n in TENSOR_OPS else vec))
    # Only the last position of each sequence needs logits: final_norm and lm_head see `batch` rows.
    ops.append(OpCost("final_norm", F.rmsnorm(batch, cfg.hidden, act_dtype=dt.act, weight_dtype=dt.act), 1, vec))
    # lm_head is vocab-parallel: each rank computes its V/N logits (the padded vocabulary's share)
    vocab = cfg.vocab if tp == 1 else sh.vocab
    ops.append(OpCost("lm_head", F.lm_head(batch, cfg.hidden, vocab, act_dtype=dt.act, **dt.weight_quant), 1,
                      dt.act))
    return Phase(phase, cfg, batch, new_tokens, context, cached, tuple(chunks), dt, tuple(ops), tp, sh,
                 step_collectives(cfg, sh, batch, chunks, dt.act))


def prefill(cfg: ModelConfig, batch: int, prompt_tokens: int, cached_tokens: int = 0, chunk: int | None = None,
            *, weight_dtype="bf16", act_dtype="bf16", kv_dtype="bf16", tp: int = 1, group_size: int | None = None,
            zero_point: bool = False) -> Phase:
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
    dt = _check_dtypes(weight_dtype, act_dtype, kv_dtype, group_size, zero_point)
    return _assemble("prefill", cfg, dt, batch, new, prompt_tokens, cached_tokens, chunks, cached_tokens, False, tp)


def decode(cfg: ModelConfig, batch: int, context: int, *, weight_dtype="bf16", act_dtype="bf16",
           kv_dtype="bf16", tp: int = 1, group_size: int | None = None, zero_point: bool = False) -> Phase:
    """One decode step: each of ``batch`` sequences has ``context`` cached tokens and adds one (one rank's
    share over ``tp`` ranks)."""
    batch = check_positive_int("batch", batch)
    context = check_positive_int("context (--context)", context)
    if context + 1 > cfg.max_context:
        raise RooflineError(f"a decode step at context {context} needs {context + 1} positions, past "
                            f"{cfg.name}'s maximum context of {cfg.max_context}.")
    dt = _check_dtypes(weight_dtype, act_dtype, kv_dtype, group_size, zero_point)
    return _assemble("decode", cfg, dt, batch, 1, context, 0, [1], context, True, tp)


def request_steps(output_tokens: int) -> tuple[int, int]:
    """(prefill steps, decode steps) for a request of ``output_tokens`` ordinary output tokens.

    Prefill predicts the first token; every later token needs one decode step that
    consumes the previous one. N tokens: 1 prefill + N-1 decode (N=1: no decode step).
    """
    n = check_positive_int("output tokens", output_tokens)
    return 1, n - 1
