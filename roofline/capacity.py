"""Does the model fit? Weights + KV cache + activations at a batch and context against a device's memory.

``capacity(cfg, device, batch, context, tp=...)`` returns a ``Capacity`` with one rank's bytes (under
--tp every rank holds its shard: ``roofline.parallel``), the verdict, the largest batch that fits at
that context, and the smallest tensor-parallel degree that fits one sequence. With ``ep`` (expert
parallelism: ``ep`` = ``tp`` ranks, each holding E / ep whole experts) a rank's expert bytes are its own
experts', and the smallest degree is searched as expert-parallel (--ep) instead. Everything is counted
from ``roofline.layer``'s op list:

* weights: every WeightSpec as its op's kind holds it (``OpKind.resident``): linears and experts in their
  module's format (``roofline.precision``: the checkpoint's, or a flag's; scales included), the embedding,
  norms and biases in the activation dtype; a tied lm_head is the embedding (once);
* KV cache: ``batch`` sequences of ``context`` tokens, each attention layer's capped at its window
  (``formulas.kv_cache_bytes``: a ring buffer holds at most the window) or, chunked (Llama-4), at its chunk
  (the current chunk's keys, at their peak min(context, chunk)), as a server with a sliding-window
  cache allocates it. ``windowed_kv=False`` counts every layer at the full context: what our own model
  (``kernels.model``, which has no ring buffer) allocates, so ``latency`` and ``serve`` check that; Gated
  DeltaNet layers (Qwen3-Next, Qwen3.5) and Mamba-2 layers (Nemotron-H, Granite-4.0-H) hold no KV but a state
  per sequence, constant in the context (``state_bytes``: counted with the KV cache); DeepSeek Sparse Attention's
  indexer keeps its own key cache per token beside the latent one (``index_bytes``: counted with the KV cache);
* activations: the largest live set of one layer's step, NB: an estimate: the residual stream, the
  attention input and output and the MLP's gate, up and activation for every new token
  (T x (3 H + q + 2 kv + 3 I) elements), plus the fp32 logits of one row per sequence.

Nothing here counts a framework's workspace, CUDA context or fragmentation (typically 1-3 GB on a
GPU): a fit within a few percent is said as tight.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import formulas as F
from . import units as U
from .dtypes import bytes_per_element
from .errors import RooflineError
from .layer import model_ops
from .models import ModelConfig
from .ops import kind
from .parallel import ranks, shard
from .precision import Precision, plain

TIGHT = 0.9   # above this share of the memory a fit is "tight"


@dataclass(frozen=True)
class Capacity:
    model: str
    device: str
    memory_bytes: float          # one device's (0: unknown)
    tp: int
    batch: int
    context: int
    weight_bytes: float          # one rank's
    kv_bytes: float              # one rank's, for batch x context
    activation_bytes: float      # one rank's, an estimate
    max_batch: int               # the largest batch that fits at this context and tp (0: not even one)
    min_tp: int                  # the smallest tp that fits batch 1 at this context (0: none up to 64)
    min_tp_max_batch: int = 0    # the largest batch that fits at min_tp
    ep: int = 1                  # expert-parallel ranks (= tp when > 1); min_tp is then an --ep degree
    full_window_kv: bool = False  # windowed layers counted at the full context (our model's allocation)
    weights_said: str = ""       # each module's precision, said beside the weight bytes ("" for one float)

    @property
    def total_bytes(self) -> float:
        return self.weight_bytes + self.kv_bytes + self.activation_bytes

    @property
    def known(self) -> bool:
        return self.memory_bytes > 0

    @property
    def fits(self) -> bool:
        return not self.known or self.total_bytes <= self.memory_bytes

    @property
    def verdict(self) -> str:
        if not self.known:
            return "unknown"
        if not self.fits:
            return "does not fit"
        return "fits (tight)" if self.total_bytes > TIGHT * self.memory_bytes else "fits"

    @property
    def sentence(self) -> str:
        where = f"{self.tp} x {self.device}" if self.tp > 1 else f"one {self.device}"
        where += f" (expert parallel: {self.ep} ranks)" if self.ep > 1 else ""
        per = " per rank" if self.tp > 1 else ""
        said = f" ({self.weights_said})" if self.weights_said else ""
        need = (f"{self.model} needs {U.nbytes(self.weight_bytes)} of weights{per}{said} + "
                f"{U.nbytes(self.kv_bytes)} of KV cache (batch {self.batch} x context {self.context:,}"
                f"{', every layer at full length as our model allocates it' if self.full_window_kv else ''}) + "
                f"~{U.nbytes(self.activation_bytes)} of activations")
        if not self.known:
            return f"{need}; {self.device}'s memory is unknown, so whether it fits is not said."
        have = f"{U.nbytes(self.memory_bytes)}"
        if self.fits:
            return (f"{need} = {U.nbytes(self.total_bytes)} of {where}'s {have}: {self.verdict}; "
                    f"up to batch {self.max_batch:,} fits at this context.")
        if self.max_batch:
            hint = f"batch <= {self.max_batch:,} fits at this context"
        elif self.min_tp:
            opt = "--ep" if self.ep > 1 else "--tp"
            hint = f"{opt} {self.min_tp} fits at batch <= {self.min_tp_max_batch:,} at this context"
        else:
            hint = (f"no {'expert' if self.ep > 1 else 'tensor'}-parallel degree up to 64 fits one sequence at this "
                    "context")
        return f"{need} = {U.nbytes(self.total_bytes)}, more than {where}'s {have}: does not fit; {hint}."

    def to_dict(self) -> dict:
        return {"verdict": self.verdict, "fits": self.fits, "memory_bytes": self.memory_bytes, "tp": self.tp,
                "ep": self.ep,
                "batch": self.batch, "context": self.context, "weight_bytes": self.weight_bytes,
                "kv_bytes": self.kv_bytes, "activation_bytes": self.activation_bytes,
                "total_bytes": self.total_bytes, "max_batch": self.max_batch, "min_tp": self.min_tp,
                "min_tp_max_batch": self.min_tp_max_batch, "sentence": self.sentence}


def weight_bytes(cfg: ModelConfig, tp: int = 1, *, weight_dtype="bf16", act_dtype="bf16", group_size=None,
                 zero_point=False, ep: int = 1, precision: Precision | None = None) -> float:
    """One rank's bytes of every weight of ``cfg``: each as its op's kind holds it (``OpKind.resident``: a
    linear's or the experts' in their module's format, scales included; kv_b_proj also as decode's dequantized
    copy; norms, biases and the embedding table in their float) under ``precision`` (each module's formats,
    ``roofline.precision``; default: a plain ``weight_dtype`` for every linear, the rest in ``act_dtype``); under
    ``ep`` its E / ep whole experts."""
    p = precision or plain(weight_dtype, group_size=group_size, zero_point=zero_point)
    return sum((o.count if o.per_layer else 1) * kind(o.kind).resident(o, w, p, act_dtype)
               for o in model_ops(cfg, shard(cfg, tp, ep)) for w in o.weights)


def weight_bytes_by_module(cfg: ModelConfig, precision: Precision, act_dtype="bf16", tp: int = 1, ep: int = 1) -> dict:
    """One rank's resident weight bytes per module class (``OpSpec.module``; norms under "norm"), in op order."""
    out: dict = {}
    for o in model_ops(cfg, shard(cfg, tp, ep)):
        for w in o.weights:
            out[o.module or "other"] = out.get(o.module or "other", 0.0) + (o.count if o.per_layer else 1) * \
                kind(o.kind).resident(o, w, precision, act_dtype)
    return out


def kv_bytes(cfg: ModelConfig, batch: int, context: int, tp: int = 1, *, kv_dtype="bf16",
             windowed: bool = True, kv_scales: bool = True) -> float:
    """One rank's KV cache for ``batch`` x ``context`` (``kv_scales``: a scale per token and KV head, as our
    8-bit caches keep; False for a checkpoint's per-tensor scales)."""
    if cfg.mla:   # the latent cache, replicated on every rank (each rank's heads read all of it), + DSA's keys
        return batch * (F.mla_cache_bytes(context, cfg.n_layers, cfg.kv_lora_rank, cfg.qk_rope_dim, kv_dtype=kv_dtype)
                        + index_bytes(cfg, context))
    sh = shard(cfg, tp)
    windows, chunks = cfg.windows, cfg.chunks
    return batch * (sum(F.kv_cache_bytes(context, 1, sh.n_kv_heads, cfg.head_dim, kv_dtype=kv_dtype,
                                         kv_scales=kv_scales, window=(windows[i] or None) if windowed else None,
                                         chunk=(chunks[i] or None) if windowed else None)   # chunked: min(S, C)
                        for i in cfg.attention_layers) + state_bytes(cfg))


def index_bytes(cfg: ModelConfig, context: int) -> float:
    """One sequence's DeepSeek Sparse Attention key cache at ``context`` tokens: every indexer layer's fp8 key
    and its fp32 scales per token (``formulas.dsa.index_key_bytes``: 132 bytes for a 128-wide key, as vLLM and
    SGLang store it, whatever the latent cache's dtype), replicated on every rank; 0 without an indexer."""
    return F.index_cache_bytes(context, len(cfg.index_layers), cfg.index_head_dim) if cfg.index_topk else 0.0


def state_bytes(cfg: ModelConfig, *, act_dtype="bf16") -> float:
    """One sequence's state across its Gated DeltaNet and Mamba-2 layers, whatever the context
    (``layer_states``); 0 for a model without such layers."""
    return sum(b for _, _, b in layer_states(cfg, act_dtype=act_dtype))


def layer_states(cfg: ModelConfig, *, act_dtype="bf16") -> tuple:
    """(kind, layers, bytes) of one sequence's state per kind of stateful layer: Gated DeltaNet's recurrent state
    [v_heads, k_dim, v_dim] (``formulas.deltanet``) and Mamba-2's SSM state [heads, head_dim, d_state]
    (``formulas.mamba``), both fp32, each with its conv state (kernel - 1 inputs of its channels, in
    ``act_dtype``) per layer; () for a model without such layers."""
    out = []
    if cfg.linear_layers:
        n = len(cfg.linear_layers)
        out.append(("DeltaNet", n, n * F.deltanet_state_bytes(cfg.linear_k_heads, cfg.linear_v_heads, cfg.linear_k_dim,
                                                              cfg.linear_v_dim, cfg.linear_conv, act_dtype=act_dtype)))
    if cfg.mamba_layers:
        n = len(cfg.mamba_layers)
        out.append(("Mamba-2", n, n * F.mamba_state_bytes(cfg.mamba_heads, cfg.mamba_head_dim, cfg.mamba_state,
                                                          cfg.mamba_groups, cfg.mamba_conv, act_dtype=act_dtype)))
    return tuple(out)


def activation_bytes(cfg: ModelConfig, batch: int, new_tokens: int, tp: int = 1, *, act_dtype="bf16") -> float:
    sh = shard(cfg, tp)
    T = batch * new_tokens
    per_token = 3 * cfg.hidden + sh.q_dim + 2 * sh.kv_dim + 3 * sh.intermediate
    return T * per_token * bytes_per_element(act_dtype) + batch * sh.vocab * 4


def _fits(cfg, memory, batch, context, tp, new_tokens, dt, ep=1) -> bool:
    need = (weight_bytes(cfg, tp, ep=ep, **dt["w"])
            + kv_bytes(cfg, batch, context, tp, kv_dtype=dt["kv"], windowed=dt["win"], kv_scales=dt["kv_scales"])
            + activation_bytes(cfg, batch, new_tokens, tp, act_dtype=dt["w"]["act_dtype"]))
    return need <= memory


def capacity(cfg: ModelConfig, device, batch: int, context: int, *, tp: int = 1, new_tokens: int = 1,
             weight_dtype="bf16", act_dtype="bf16", kv_dtype="bf16", group_size=None, zero_point=False,
             ep: int = 1, windowed_kv: bool = True, precision: Precision | None = None,
             weights_said: str = "") -> Capacity:
    """The fit of ``batch`` sequences of ``context`` tokens (``new_tokens`` each this step: 1 for decode, the
    prompt for prefill) on ``device`` (its ``memory_bytes``) at ``tp`` ranks (``ep``: expert parallel), the
    weights under ``precision`` (``weight_bytes``) and the KV cache in ``kv_dtype``, with per-token scales unless
    the precision's KV format keeps per-tensor ones (``kv_bytes``)."""
    tp, ep = ranks(tp, ep)
    kv_scales = precision.kv_scales if precision is not None and precision.kv is not None else True
    dt = {"w": dict(weight_dtype=weight_dtype, act_dtype=act_dtype, group_size=group_size, zero_point=zero_point,
                    precision=precision), "kv": kv_dtype, "win": windowed_kv, "kv_scales": kv_scales}
    mem = float(getattr(device, "memory_bytes", 0) or 0)
    wb = weight_bytes(cfg, tp, ep=ep, **dt["w"])
    kb = kv_bytes(cfg, batch, context, tp, kv_dtype=kv_dtype, windowed=windowed_kv, kv_scales=kv_scales)
    ab = activation_bytes(cfg, batch, new_tokens, tp, act_dtype=act_dtype)
    max_batch = min_tp = min_tp_batch = 0
    if mem:
        max_batch = _max_batch(cfg, mem, context, tp, new_tokens, dt, ep)
        for n in (1, 2, 4, 8, 16, 32, 64):
            try:   # under --ep the degrees searched are expert parallel too (ep = tp = n)
                b = _max_batch(cfg, mem, context, n, new_tokens, dt, n if ep > 1 else 1)
            except RooflineError:   # a degree the heads do not allow (roofline.parallel's rules)
                continue
            if b:
                min_tp, min_tp_batch = n, b
                break
    return Capacity(cfg.name, getattr(device, "name", str(device)), mem, tp, batch, context, wb, kb, ab,
                    max_batch, min_tp, min_tp_batch, ep, not windowed_kv and any(cfg.windows + cfg.chunks), weights_said)


def _max_batch(cfg, mem, context, tp, new_tokens, dt, ep=1) -> int:
    """The largest batch that fits (0: not even one sequence), by doubling then bisecting."""
    fits = lambda b: _fits(cfg, mem, b, context, tp, new_tokens, dt, ep)  # noqa: E731
    if not fits(1):
        return 0
    lo, hi = 1, 2
    while fits(hi) and hi < 1 << 24:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo
