"""What every runner of one profiling point reads: the ``RunContext`` (model and this rank's shard, dtypes,
backend, the phase's sizes, the one-layer weights, the preallocated random inputs, KV caches, the point's
routing and latent cache), built once per point by ``build_context``, and the one-layer weights a sweep's
points share (``one_layer_weights``).

Inputs are drawn from ``seed + 1`` in a fixed order (the hidden rows, q/k/v heads, the attention output, the
MLP's gate/up/activation, the caches, token ids, the last rows and logits, then the latent state, then DSA's
indexer state), so a point's
inputs do not depend on which ops it runs; ``rows_of`` draws a [T, width] input per new width on first use.
On the meta device (the compile check) inputs are empty tensors: shapes only.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from roofline.models import ModelConfig

from ._common import dtype_name
from .checkpoint import load_weights
from .decode_attention import decode_config, verify_config
from .dsa import index_topk
from .mla_layer import mla_decode_attend, mla_prefill_attend
from .model import route
from .weights import init_weights, seeded_generator
from .prefill_attention import DEQUANT_NOTE, attention_config
from .quant import KV_DTYPES, kv_storage, prepare_model_torch, quantize_kv_rows, quantize_model_weights
from .rope import rope_tables
from .sinks import decode_with_sinks, prefill_with_sinks
from .tp import dispatch_plan, shard_weights, tp_parts

_WEIGHTS: dict = {}   # the last one-layer weights built: a sweep's points share them (same model, dtype, seed)


def one_layer_weights(cfg: ModelConfig, dt, dev, seed: int, tp=None, prec=None, backend="triton") -> tuple:
    """(one layer's weights plus the embedding and lm_head, the checkpoint loader's notes), built once per (model,
    dtype, device, seed, precision).

    Every point of a sweep times the same weights; building them (random normal, the embedding
    and lm_head are vocab x hidden) cost a sweep a third of a second per point on a CPU. Only the
    last set is kept, so a sweep over another model does not hold two in memory. ``prec`` (a
    ``kernels.run_precision.RunPrecision``) holds each module as the run does: the same seeded weights (or the
    checkpoint's, as stored where ``backend`` runs its format and no flag asked for another) quantized per module.
    """
    quant = prec is not None and (prec.quantized or bool(cfg.checkpoint))
    key = (cfg, dt, str(dev), seed, (tp.rank, tp.world, tp.ep) if tp is not None else None, prec,
           backend if quant else None)
    if key not in _WEIGHTS:
        _WEIGHTS.clear()
        picks = timed_layers(cfg)
        notes = ()
        if cfg.checkpoint and dev.type != "meta":   # the checkpoint's layers, embedding and lm_head
            stored = backend if tp is None and prec is not None and not prec.flagged else None
            w, info = load_weights(cfg, cfg.checkpoint, dt, dev, layers=list(picks), backend=stored)
            notes = tuple(info.get("notes", ()))
        else:
            w = init_weights(_with_picks(cfg, picks), dt, dev, seed)
        if quant:                             # all quantized, then sharded (kernels.tp: exact rows of it)
            w = quantize_model_weights(cfg, w, prec, backend=backend if tp is None else "")
        if tp is not None:                    # this rank's slice of the same seeded weights (the picked layers' rules)
            w = shard_weights(_with_picks(cfg, picks), w, tp_parts(cfg, tp)[0], tp.rank)
            if quant and backend == "torch":
                prepare_model_torch(w)
        _WEIGHTS[key] = w, notes
    return _WEIGHTS[key]


def timed_layers(cfg: ModelConfig) -> tuple:
    """The layers whose weights a sweep builds: the first, and the first routed one when the model has dense
    layers too (DeepSeek's first 3 are dense), a hybrid's first attention and first DeltaNet or Mamba-2 layer (and
    Nemotron-H's first dense MLP block): every op of the op list then has its weights."""
    moe = cfg.moe_layers
    dense = [i for i in range(cfg.n_layers) if i not in moe]
    picks = {dense[0], moe[0]} if moe and dense else {0}
    if cfg.linear_layers:
        picks |= {cfg.linear_layers[0], cfg.attention_layers[0]} if cfg.attention_layers else {cfg.linear_layers[0]}
    if cfg.mamba_layers:        # a Mamba-2 layer, an attention layer, an MLP one (Nemotron-H's blocks hold one each)
        mlp = [i for i in cfg.mlp_layers if i not in moe]
        picks |= {cfg.mamba_layers[0]} | ({cfg.attention_layers[0]} if cfg.attention_layers else set()) | (
            {mlp[0]} if mlp else set())
    return tuple(sorted(picks))


def _with_picks(cfg: ModelConfig, picks: tuple) -> ModelConfig:
    """A config of len(picks) layers laid out as those layers are in ``cfg`` (which are dense, which routed,
    which DeltaNet or Mamba-2, which without RoPE or MLP)."""
    one = cfg.with_layers(len(picks))
    if cfg.linear_layers or cfg.mamba_layers:
        one = replace(one, layer_types=tuple(cfg.layer_types[i] for i in picks),
                      nope_layers=tuple(j for j, i in enumerate(picks) if i in cfg.nope_layers),
                      no_mlp_layers=tuple(j for j, i in enumerate(picks) if i in cfg.no_mlp_layers))
    if cfg.index_shared:                  # GLM-5: which picked layers reuse a selection (layer 0 never does)
        one = replace(one, index_shared=tuple(j for j, i in enumerate(picks) if i in cfg.index_shared))
    if not cfg.n_experts:
        return one
    return replace(one, dense_layers=tuple(j for j, i in enumerate(picks) if i not in cfg.moe_layers))


@dataclass
class DeltaInputs:
    """Gated DeltaNet's inputs of the point: the conv's [B, n, C] input and the B sequences' conv states
    [B, C, kernel - 1], a and b [T, Hv], q, k [B, n, Hk, dk], v [B, n, Hv, dv], g (fp32), beta [B, n, Hv], the
    recurrent states [B, Hv, dk, dv] fp32 (random: as the KV cache), the rule's output o and z [T Hv, dv]."""

    qkv: torch.Tensor
    conv: torch.Tensor
    a: torch.Tensor
    b: torch.Tensor
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    state: torch.Tensor
    o: torch.Tensor
    z: torch.Tensor


@dataclass
class MambaInputs:
    """Mamba-2's inputs of the point: the conv's [B, n, C] input (x, B, C) and the B sequences' conv states
    [B, C, kernel - 1], the SSM states [B, H, P, N] fp32 (random: as the KV cache), the scan's output y and z
    [T, inner] (the gated norm's)."""

    xbc: torch.Tensor
    conv: torch.Tensor
    state: torch.Tensor
    y: torch.Tensor
    z: torch.Tensor


@dataclass
class Routing:
    """The point's routing of its random hidden rows (the experts op runs the same choice), and under expert
    parallelism this rank's dispatch of it (``kernels.tp.Dispatch``)."""

    weights: torch.Tensor
    ids: torch.Tensor
    touched: int
    imbalance: float
    plan: object = None


@dataclass
class Latent:
    """MLA's latent cache of the point ([B, S, R], [B, S, P]), its attention closure (naive prefill / absorbed
    decode) and the new rows: q_nope, q_pe, the rope key and the latent."""

    ckv: torch.Tensor
    kpe: torch.Tensor
    attend: Callable
    q_nope: torch.Tensor
    q_pe: torch.Tensor
    k_pe: torch.Tensor
    c_lat: torch.Tensor


@dataclass
class Index:
    """DeepSeek Sparse Attention's indexer state of the point: its key cache [B, S, Di], the new rows' query
    [T, Hi, Di], key [T, Di] and head weights [T, Hi] (fp32), each query row's slot and visible keys, and the
    scores and the selection ([T, S] fp32, [T, min(topk, S)] int32) computed once from them (what index_topk
    and the sparse attention read)."""

    cache: torch.Tensor
    q: torch.Tensor
    k: torch.Tensor
    w: torch.Tensor
    slots: torch.Tensor
    limits: torch.Tensor
    scores: torch.Tensor
    indices: torch.Tensor


@dataclass
class RunContext:
    """One profiling point of one rank: read by every runner builder (``kernels.runner_registry``)."""

    cfg: ModelConfig            # the model
    lcfg: ModelConfig           # this rank's layer sizes (the model's own at one rank)
    sh: object                  # roofline.parallel.Shard
    tp: object                  # kernels.tp.TPGroup, None at one rank
    phase: str
    K: object                   # the backend's ops (kernels.backend.get_ops)
    dt: torch.dtype
    dev: torch.device
    prec: object                # kernels.run_precision.RunPrecision: each module's format as the run holds it
    kvdt: str                   # KV cache dtype name
    B: int
    n: int                      # new tokens per sequence
    kv_len: int                 # keys attended
    w: dict                     # the one-layer weights (embed, lm_head, layers)
    rnd: Callable               # rnd(*shape): random (or, on meta, empty) activations
    lw: dict = field(default_factory=dict)       # the dense and the routed layer's weights, one dict
    load_notes: tuple = ()                       # the checkpoint loader's, one per module class and format
    # rope tables, positions [T], the batch's cache slots, each row's slot
    cos: torch.Tensor = None
    sin: torch.Tensor = None
    pos: torch.Tensor = None
    slots: torch.Tensor = None
    tok_slot: torch.Tensor = None
    # activations: x, r, h [T, H]; q, k, v [T, heads, D]; o [T, Hq D]; gate, up, act [T, I]
    x: torch.Tensor = None
    r: torch.Tensor = None
    h: torch.Tensor = None
    q: torch.Tensor = None
    k: torch.Tensor = None
    v: torch.Tensor = None
    o: torch.Tensor = None
    gate: torch.Tensor = None
    up: torch.Tensor = None
    act: torch.Tensor = None
    ids: torch.Tensor = None                     # [T] token ids
    last: torch.Tensor = None                    # [B, H]: final_norm / lm_head rows
    logits: torch.Tensor = None                  # [B, V / N]: final_softcap's input
    # the KV cache [B, Hkv, S, D] (8-bit: with per-token scales), the attention call over it and its config
    k_cache: torch.Tensor = None
    v_cache: torch.Tensor = None
    kv_scales: tuple = None
    attend: Callable = None
    attn_cfg: dict = field(default_factory=dict)
    widths: dict = field(default_factory=dict)
    routing: Routing | None = None
    latent: Latent | None = None
    delta: DeltaInputs | None = None
    mamba: MambaInputs | None = None
    index: Index | None = None

    @property
    def dname(self) -> str:
        return dtype_name(self.dt)

    @property
    def T(self) -> int:
        return self.B * self.n

    @property
    def qw(self) -> bool:
        return self.prec.quantized

    @property
    def qkv(self) -> bool:
        return self.kvdt in KV_DTYPES

    @property
    def ep(self) -> bool:
        return self.tp is not None and self.tp.ep > 1 and bool(self.cfg.n_experts)

    @property
    def triton(self) -> bool:
        return self.K.name == "triton"

    @property
    def skw(self) -> dict:
        """The attention / kv_append keywords of the cache: its scales when 8-bit."""
        return {} if self.kv_scales is None else {"scales": self.kv_scales}

    @property
    def kv_cfg(self) -> dict:
        """What a runner over the 8-bit KV cache says about it."""
        if not self.qkv:
            return {}
        return {"kv_cache": f"{self.kvdt}, fp32 scale per token per KV head"} | (
            {} if self.triton else {"impl": DEQUANT_NOTE})

    def rows_of(self, width: int):
        """[T, width] random rows (one tensor per width): the input of a linear or norm of that width."""
        if width == self.cfg.hidden:
            return self.h
        if width not in self.widths:
            self.widths[width] = self.rnd(self.T, width)
        return self.widths[width]


def build_context(cfg: ModelConfig, phase: str, batch: int, context: int, *, K, dt, dev, seed: int, tp, prec,
                  kvdt: str, spec_k: int = 0) -> RunContext:
    """The point's context: weights (``one_layer_weights``), inputs drawn in their fixed order, the KV cache and
    the attention call, the point's routing and latent cache. Phase "verify" (speculative decoding's verify step,
    ``spec_k`` = k drafts): k + 1 new tokens per sequence after ``context`` cached ones, logits at every one."""
    g = seeded_generator(dev, seed + 1)
    rnd = lambda *s: torch.randn(*s, generator=g, device=dev, dtype=torch.float32).to(dt)  # noqa: E731
    if g is None:                                        # meta tensors: shapes only (the compile check)
        rnd = lambda *s: torch.empty(*s, device=dev, dtype=dt)  # noqa: E731
    sh, lcfg = tp_parts(cfg, tp)                         # this rank's sizes (the model's own at one rank)
    n = context if phase == "prefill" else spec_k + 1 if phase == "verify" else 1
    w, notes = one_layer_weights(cfg, dt, dev, seed, tp, prec, K.name)
    c = RunContext(cfg, lcfg, sh, tp, phase, K, dt, dev, prec, kvdt, batch, n,
                   context if phase == "prefill" else context + n, w, rnd, load_notes=notes,
                   lw={k_: t for layer in w["layers"] for k_, t in layer.items()})
    T, H, I, D, Hq, Hkv = c.T, cfg.hidden, lcfg.intermediate, cfg.head_dim, lcfg.n_heads, lcfg.n_kv_heads
    c.cos, c.sin = rope_tables(c.kv_len, cfg.qk_rope_dim if cfg.mla else D, cfg.rope_theta, dev, cfg.rope_yarn)
    c.x, c.r, c.h = rnd(T, H), rnd(T, H), rnd(T, H)
    c.q, c.k, c.v = rnd(T, Hq, D), rnd(T, Hkv, D), rnd(T, Hkv, D)
    c.o = rnd(T, Hq * D)
    c.gate, c.up, c.act = rnd(T, I), rnd(T, I), rnd(T, I)
    _kv_cache(c, seed, rnd)
    _attention(c, context)
    c.ids = torch.randint(0, cfg.vocab, (T,), generator=g, device=dev)
    edge = T if phase == "verify" else batch                 # the verify step's logits: every position's
    c.last, c.logits = rnd(edge, H), rnd(edge, sh.vocab)
    if cfg.n_experts:
        c.routing = _routing(c)
    if cfg.mla:
        c.latent = _latent(c)
    if cfg.linear_layers:
        c.delta = _delta(c)
    if cfg.mamba_layers:
        c.mamba = _mamba(c)
    if cfg.index_topk:
        c.index = _index(c)
    return c


def _delta(c: RunContext) -> DeltaInputs:
    """Gated DeltaNet's inputs of this point (``DeltaInputs``), drawn after the others."""
    cfg, rnd, B, n, T = c.cfg, c.rnd, c.B, c.n, c.T
    Hk, Hv, dk, dv = cfg.linear_k_heads, cfg.linear_v_heads, cfg.linear_k_dim, cfg.linear_v_dim
    C = 2 * Hk * dk + Hv * dv
    f32 = lambda *s: rnd(*s).float()  # noqa: E731
    g = -f32(B, n, Hv).abs() * 0.1                                        # decays in log space: <= 0
    return DeltaInputs(rnd(B, n, C), rnd(B, C, cfg.linear_conv - 1), rnd(T, Hv), rnd(T, Hv), rnd(B, n, Hk, dk),
                       rnd(B, n, Hk, dk), rnd(B, n, Hv, dv), g, rnd(B, n, Hv).sigmoid(), f32(B, Hv, dk, dv),
                       rnd(T * Hv, dv), rnd(T * Hv, dv))


def _mamba(c: RunContext) -> MambaInputs:
    """Mamba-2's inputs of this point (``MambaInputs``), drawn after the others."""
    cfg, rnd, B, n, T = c.cfg, c.rnd, c.B, c.n, c.T
    Hm, P, G, N = cfg.mamba_heads, cfg.mamba_head_dim, cfg.mamba_groups, cfg.mamba_state
    inner = Hm * P
    return MambaInputs(rnd(B, n, inner + 2 * G * N), rnd(B, inner + 2 * G * N, cfg.mamba_conv - 1),
                       rnd(B, Hm, P, N).float(), rnd(T, inner), rnd(T, inner))


def _kv_cache(c: RunContext, seed: int, rnd) -> None:
    """The point's KV cache: random values (8-bit: quantized once, per-token scales)."""
    shape = (c.B, c.lcfg.n_kv_heads, c.kv_len, c.cfg.head_dim)
    if not c.qkv:
        c.k_cache, c.v_cache = rnd(*shape), rnd(*shape)
        return
    g_ = seeded_generator(c.dev, seed + 2)
    if g_ is not None:
        (c.k_cache, ks), (c.v_cache, vs) = (quantize_kv_rows(torch.randn(*shape, generator=g_, device=c.dev), c.kvdt)
                                            for _ in range(2))
    else:                       # meta: shapes only
        c.k_cache, c.v_cache = (torch.empty(shape, dtype=kv_storage(c.kvdt), device=c.dev) for _ in range(2))
        ks, vs = (torch.empty(shape[:-1], dtype=torch.float32, device=c.dev) for _ in range(2))
    c.kv_scales = (ks, vs)


def _attention(c: RunContext, context: int) -> None:
    """Positions, slots and the attention call of the phase (prefill: n new tokens from 0; decode: one token
    after ``context`` cached; verify: n = k + 1 after ``context``, ``decode_attention.verify_attention``), with its
    launch config."""
    B, n, D, Hq, K = c.B, c.n, c.cfg.head_dim, c.lcfg.n_heads, c.K
    c.slots = slots = torch.arange(B, device=c.dev)
    if c.phase == "prefill":
        c.pos = torch.arange(n, device=c.dev).repeat(B)
        c.tok_slot = slots.repeat_interleave(n)
        c.attn_cfg = attention_config(n, D, c.dt, kv_quant=c.qkv)

        def attend(qq, kc, vc, **akw):
            fn = prefill_with_sinks if "sinks" in akw and K.name != "triton" else K.prefill_attention
            return fn(qq.view(B, n, Hq, D), kc, vc, slots, 0, **akw).reshape(qq.shape)
    elif c.phase == "verify":                          # n = k + 1 tokens after ``context``, causal among them
        c.pos = (context + torch.arange(n, device=c.dev)).repeat(B)
        c.tok_slot = slots.repeat_interleave(n)
        lens, kv_len = torch.full((B,), c.kv_len, dtype=torch.long, device=c.dev), c.kv_len
        c.attn_cfg = verify_config(B, n, Hq, c.lcfg.n_kv_heads, kv_len, c.dev, dtype=c.dt, kv_quant=c.qkv)

        def attend(qq, kc, vc, **akw):
            return K.verify_attention(qq.view(B, n, Hq, D), kc, vc, lens, slots, max_len=kv_len,
                                      **akw).reshape(qq.shape)
    else:
        c.pos = torch.full((B,), context, dtype=torch.long, device=c.dev)
        c.tok_slot = slots
        lens, kv_len = c.pos + 1, c.kv_len
        c.attn_cfg = decode_config(B, c.lcfg.n_kv_heads, kv_len, c.dev, dtype=c.dt, kv_quant=c.qkv)

        def attend(qq, kc, vc, **akw):
            fn = decode_with_sinks if "sinks" in akw and K.name != "triton" else K.decode_attention
            return fn(qq, kc, vc, lens, slots, max_len=kv_len, **akw)
    c.attend = attend


def _routing(c: RunContext) -> Routing:
    """This point's routing of the random hidden rows, once (the experts op runs the same choice)."""
    rw, rids = route(c.K, c.lcfg, c.lw, c.h)
    touched = int(torch.unique(rids).numel()) if c.dev.type != "meta" else 0
    counts = torch.bincount(rids.reshape(-1).long(), minlength=c.cfg.n_experts) if touched else None  # = moe_align's
    imbalance = round(float(counts.max()) / float(counts[counts > 0].float().mean()), 4) if touched else 0.0
    plan = dispatch_plan(rw, rids, c.tp.world, c.tp.rank, c.sh.n_experts) if c.ep else None
    return Routing(rw, rids, touched, imbalance, plan)


def _latent(c: RunContext) -> Latent:
    """The latent cache of this point and the attention closure (naive prefill / absorbed decode)."""
    cfg, rnd, T, Hq = c.cfg, c.rnd, c.T, c.lcfg.n_heads
    ckv, kpe = rnd(c.B, c.kv_len, cfg.kv_lora_rank), rnd(c.B, c.kv_len, cfg.qk_rope_dim)
    att = (mla_prefill_attend(c.K, c.lcfg, c.slots, 0, c.n) if c.phase == "prefill"
           else mla_decode_attend(c.K, c.lcfg, c.pos + 1, c.slots, c.kv_len))
    q_nope, q_pe = rnd(T, Hq, cfg.qk_nope_dim), rnd(T, Hq, cfg.qk_rope_dim)
    k_pe, c_lat = rnd(T, 1, cfg.qk_rope_dim), rnd(T, cfg.kv_lora_rank)
    return Latent(ckv, kpe, att, q_nope, q_pe, k_pe, c_lat)


def _index(c: RunContext) -> Index:
    """The indexer's state of this point (drawn after the latent state): its key cache and new rows, each query
    row's slot and visible keys (prefill: positions 0..n-1; decode: the whole context + 1), the scores and the
    selection (on the meta device: empty tensors of their shapes)."""
    cfg, rnd, T, S = c.cfg, c.rnd, c.T, c.kv_len
    Hi, Di = cfg.index_n_heads, cfg.index_head_dim
    cache, q, k = rnd(c.B, S, Di), rnd(T, Hi, Di), rnd(T, Di)
    w = rnd(T, Hi).float()
    limits = c.pos + 1
    if c.dev.type == "meta":
        scores = torch.empty(T, S, dtype=torch.float32, device=c.dev)
        indices = torch.empty(T, min(cfg.index_topk, S), dtype=torch.int32, device=c.dev)
    else:
        scores = c.K.index_scores(q, w, cache, c.tok_slot, limits, max_len=S)
        indices = index_topk(scores, cfg.index_topk)
    return Index(cache, q, k, w, c.tok_slot, limits, scores, indices)
