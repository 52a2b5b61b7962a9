"""Profiling interface: one ``OpRunner`` per op of a phase, inputs preallocated, costs from the workload.

    from kernels.runners import make_runners
    for r in make_runners(load_model("tiny"), "decode", batch=2, context=16, dtype="fp32"):
        r.fn(); print(r.name, r.cost, r.config)

Conventions are roofline.workload's, so ``cost`` is exactly ``workload.prefill/decode(...).op(name).cost``:
prefill: ``context`` is the prompt length, no cached prefix, B*context rows; decode: ``context``
tokens already cached, one new token per sequence, attention over context + 1 keys.
"layer" runs one whole transformer layer (the model's own ``transformer_layer``); its cost is the
sum of the PER_LAYER_OPS instance costs. Inputs have the shapes the model uses and random values
from ``seed``; ``fn`` only runs the op (timing belongs to the profiler).

Tensor parallelism (``tp=kernels.tp.TPGroup(rank, world)``, inside an initialised group): every op
runs on this rank's shard (``roofline.workload``'s per-rank costs, ``kernels.tp``'s weights), the
embedding as its local part, "layer" without its all-reduces, and the step's collectives
(``roofline.parallel.COLLECTIVE_OPS``) come last, flagged "communication" (cost 0: their bytes cross
the interconnect; message and wire bytes in ``config["detail"]``). Every rank gets the same runners
in the same order, so the collectives meet. Mixtures of experts run every expert at I/N (the router
replicated: every rank routes the same random rows the same way, so ``experts_touched`` agrees), latent
attention its Hq/N heads over the whole (replicated) latent cache.

Quantization (``weight_dtype="int8"|"int4"``, ``kv_dtype="int8"|"fp8"``): the one-layer weights are the
same seeded weights quantized (``kernels.quant``), the KV cache of the attention runners is 8-bit with
per-token scales, and costs are the workload's for those dtypes (scales counted). A linear's config says
which kernel ran: the Triton kernel's tiles, or ``impl`` on the torch backend (the ecosystem op, or a
dequantize reference, said so).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from roofline import workload as W
from roofline.cost import Cost
from roofline.errors import RooflineError
from roofline.layer import model_ops
from roofline.models import ModelConfig
from roofline.parallel import COLLECTIVE_OPS, EP_COLLECTIVES

from ._common import dtype_name, torch_dtype
from .backend import get_ops
from .decode_attention import decode_config
from .linear import linear_config
from .linear_int4 import linear_int4_config
from .model import attention_options, init_weights, quant_dtypes, seeded_generator, transformer_layer
from .prefill_attention import DEQUANT_NOTE, attention_config
from .quant import (KV_DTYPES, QuantWeight, WEIGHT_DTYPES, check_model_kv, check_tp_groups, decode_kv_b,
                    expert_weights_config, kv_storage, prepare_model_torch, quantize_model_weights)
from .rope import rope_tables
from .sinks import decode_with_sinks, prefill_with_sinks
from .tp import embed_local, shard_weights, tp_parts

@dataclass
class OpRunner:
    name: str                  # an op of roofline.layer.model_ops(cfg), or "layer"
    fn: Callable[[], object]   # runs the op once on preallocated inputs
    cost: Cost                 # one instance, from roofline.workload
    compute_dtype: str         # the Phase op's compute_dtype ("layer": the activation dtype)
    config: dict = field(default_factory=dict)  # backend, block sizes, split count ...
    flags: tuple = ()          # ("communication",) for a collective: kept off the HBM roofline


_WEIGHTS: dict = {}   # the last one-layer weights built: a sweep's points share them (same model, dtype, seed)


def _one_layer_weights(cfg: ModelConfig, dt, dev, seed: int, tp=None, quant=None, backend="triton") -> dict:
    """One layer's weights plus the embedding and lm_head, built once per (model, dtype, device, seed, quantization).

    Every point of a sweep times the same weights; building them (random normal, the embedding
    and lm_head are vocab x hidden) cost a sweep a third of a second per point on a CPU. Only the
    last set is kept, so a sweep over another model does not hold two in memory. ``quant`` =
    (weight dtype, group size, zero point) quantizes the same seeded weights.
    """
    key = (cfg, dt, str(dev), seed, (tp.rank, tp.world, tp.ep) if tp is not None else None, quant,
           backend if quant else None)
    if key not in _WEIGHTS:
        _WEIGHTS.clear()
        picks = timed_layers(cfg)
        if cfg.checkpoint and dev.type != "meta":   # the checkpoint's layers, embedding and lm_head
            from .checkpoint import load_weights

            w, _ = load_weights(cfg, cfg.checkpoint, dt, dev, layers=list(picks))
        else:
            w = init_weights(_with_picks(cfg, picks), dt, dev, seed)
        if quant:                             # all quantized, then sharded (kernels.tp: exact rows of it)
            wd, g, zp = quant
            w = quantize_model_weights(cfg, w, wd, group_size=g, zero_point=zp, backend=backend if tp is None else "")
        if tp is not None:                    # this rank's slice of the same seeded weights (the picked layers' rules)
            w = shard_weights(_with_picks(cfg, picks), w, tp_parts(cfg, tp)[0], tp.rank)
            if quant and backend == "torch":
                prepare_model_torch(w)
        _WEIGHTS[key] = w
    return _WEIGHTS[key]


def timed_layers(cfg: ModelConfig) -> tuple:
    """The layers whose weights a sweep builds: the first, and the first routed one when the model has dense
    layers too (DeepSeek's first 3 are dense): every op of the op list then has its weights."""
    moe = cfg.moe_layers
    dense = [i for i in range(cfg.n_layers) if i not in moe]
    return tuple(sorted((dense[0], moe[0]))) if moe and dense else (0,)


def _with_picks(cfg: ModelConfig, picks: tuple) -> ModelConfig:
    """A config of len(picks) layers laid out as those layers are in ``cfg`` (which are dense, which routed)."""
    from dataclasses import replace

    one = cfg.with_layers(len(picks))
    if not cfg.n_experts:
        return one
    return replace(one, dense_layers=tuple(j for j, i in enumerate(picks) if i not in cfg.moe_layers))


def make_runners(cfg: ModelConfig, phase: str, batch: int, context: int, *, dtype="bf16", backend="triton",
                 device="cpu", seed=0, ops=None, tp=None, weight_dtype=None, kv_dtype=None, group_size=None,
                 zero_point=False) -> list[OpRunner]:
    """Runners for every op of ``phase`` (or only ``ops``), in the model's op order then "layer" (then, under
    tensor parallelism, the collectives). ``weight_dtype`` / ``kv_dtype``: quantized weights (int8, int4 with
    ``group_size`` and ``zero_point``) and an 8-bit KV cache (int8, fp8); None: the activation dtype."""
    if phase not in ("prefill", "decode"):
        raise RooflineError(f"phase must be 'prefill' or 'decode', not {phase!r}.")
    tp = tp if tp is not None and tp.world > 1 else None
    specs = {o.name: o for o in model_ops(cfg, tp_parts(cfg, tp if tp is not None and tp.world > 1 else None)[0])}
    names = list(specs) + ["layer"] + (list(COLLECTIVE_OPS + EP_COLLECTIVES) if tp is not None else [])
    if ops is not None:
        bad = [o for o in ops if o not in names]
        if bad:
            raise RooflineError(f"unknown op {bad[0]!r}: choose from {', '.join(names)}.")
        names = [n for n in names if n in ops]
    dt = torch_dtype(dtype)
    dname = dtype_name(dt)
    dev = torch.device(device)
    wdt, kvdt = quant_dtypes(dt, weight_dtype, kv_dtype, dev)
    qw, qkv = wdt in WEIGHT_DTYPES, kvdt in KV_DTYPES
    check_model_kv(cfg, kvdt)
    gsize = int(group_size or 128)
    if tp is not None and wdt == "int4":
        check_tp_groups(cfg, tp.world, gsize)
    kw = dict(weight_dtype=wdt, act_dtype=dname, kv_dtype=kvdt, tp=tp.world if tp is not None else 1,
              group_size=gsize, zero_point=bool(zero_point) and wdt == "int4", ep=tp.ep if tp is not None else 1)
    ph = W.prefill(cfg, batch, context, **kw) if phase == "prefill" else W.decode(cfg, batch, context, **kw)
    if tp is not None:                                # the step's own collectives (under --ep: the all-to-alls)
        names = ([n for n in names if n not in COLLECTIVE_OPS + EP_COLLECTIVES]
                 + [c.name for c in ph.collectives if c.name in names])
    K = get_ops(backend)
    g = seeded_generator(dev, seed + 1)
    rnd = lambda *s: torch.randn(*s, generator=g, device=dev, dtype=torch.float32).to(dt)  # noqa: E731
    if g is None:                                        # meta tensors: shapes only (the compile check)
        rnd = lambda *s: torch.empty(*s, device=dev, dtype=dt)  # noqa: E731

    sh, lcfg = tp_parts(cfg, tp)                      # this rank's sizes (the model's own at one rank)
    B, H, I, D = batch, cfg.hidden, lcfg.intermediate, cfg.head_dim
    Hq, Hkv = lcfg.n_heads, lcfg.n_kv_heads
    n = context if phase == "prefill" else 1          # new tokens per sequence
    T = B * n
    kv_len = context if phase == "prefill" else context + 1
    quant = (wdt, gsize if wdt == "int4" else 0, kw["zero_point"]) if qw else None
    w = _one_layer_weights(cfg, dt, dev, seed, tp, quant, K.name)
    lw = {k_: t for layer in w["layers"] for k_, t in layer.items()}   # the dense and the routed layer's weights
    rd = cfg.qk_rope_dim if cfg.mla else D
    cos, sin = rope_tables(kv_len, rd, cfg.rope_theta, dev, cfg.rope_yarn)
    x, r, h = rnd(T, H), rnd(T, H), rnd(T, H)                                    # [T, H]
    q, k, v = rnd(T, Hq, D), rnd(T, Hkv, D), rnd(T, Hkv, D)                       # [T, heads, D]
    o = rnd(T, Hq * D)
    gate, up, act = rnd(T, I), rnd(T, I), rnd(T, I)
    kv_scales = None
    if qkv:                         # 8-bit cache: random values quantized once (per-token scales)
        from .quant import quantize_kv_rows

        shape = (B, Hkv, kv_len, D)
        g_ = seeded_generator(dev, seed + 2)
        if g_ is not None:
            (k_cache, ks), (v_cache, vs) = (quantize_kv_rows(torch.randn(*shape, generator=g_, device=dev), kvdt)
                                            for _ in range(2))
        else:                       # meta: shapes only
            k_cache, v_cache = (torch.empty(shape, dtype=kv_storage(kvdt), device=dev) for _ in range(2))
            ks, vs = (torch.empty(shape[:-1], dtype=torch.float32, device=dev) for _ in range(2))
        kv_scales = (ks, vs)
    else:
        k_cache, v_cache = rnd(B, Hkv, kv_len, D), rnd(B, Hkv, kv_len, D)       # k: [B, Hkv, S, D]
    slots = torch.arange(B, device=dev)
    skw = {} if kv_scales is None else {"scales": kv_scales}
    if phase == "prefill":
        pos = torch.arange(n, device=dev).repeat(B)                               # [T]
        tok_slot = slots.repeat_interleave(n)
        attn_cfg = attention_config(n, D, dt, kv_quant=qkv)

        def attend(qq, kc, vc, **akw):
            fn = prefill_with_sinks if "sinks" in akw and K.name != "triton" else K.prefill_attention
            return fn(qq.view(B, n, Hq, D), kc, vc, slots, 0, **akw).reshape(qq.shape)
    else:
        pos = torch.full((B,), context, dtype=torch.long, device=dev)
        tok_slot = slots
        lens = pos + 1
        attn_cfg = decode_config(B, Hkv, kv_len, dev, dtype=dt, kv_quant=qkv)

        def attend(qq, kc, vc, **akw):
            fn = decode_with_sinks if "sinks" in akw and K.name != "triton" else K.decode_attention
            return fn(qq, kc, vc, lens, slots, max_len=kv_len, **akw)
    ids = torch.randint(0, cfg.vocab, (T,), generator=g, device=dev)
    last = rnd(B, H)                                                              # final_norm / lm_head rows
    logits = rnd(B, sh.vocab)                                                     # final_softcap's input

    def lin_cfg(M, wt):
        Kd, N = wt.shape
        if not isinstance(wt, QuantWeight):
            return linear_config(M, N, Kd, dt, dev) if K.name == "triton" else {}
        label = {"weights": wt.dtype + (f" g{wt.group_size}" + (" zero points" if wt.zeros is not None else "")
                                        if wt.dtype == "int4" else " per-channel")}
        if K.name != "triton":
            return {**label, "impl": wt.torch_impl or "not prepared"}
        c = (linear_int4_config(M, N, Kd, wt.group_size, dt, dev, zero_point=wt.zeros is not None)
             if wt.dtype == "int4" else linear_config(M, N, Kd, dt, dev))
        return {**label, **c}

    kv_cfg = {}
    if qkv:
        kv_cfg = {"kv_cache": f"{kvdt}, fp32 scale per token per KV head"}
        if K.name != "triton":
            kv_cfg["impl"] = DEQUANT_NOTE

    act_fn = K.swiglu if cfg.activation == "silu" else K.geglu
    # the inputs each op reads: the hidden rows, q/k heads, the attention output, the MLP's activation
    lin_in = {"q_proj": h, "k_proj": h, "v_proj": h, "o_proj": o, "gate_proj": h, "up_proj": h, "down_proj": act}
    widths: dict = {}

    def rows_of(width):
        """[T, width] random rows (one tensor per width): the input of a linear or norm of that width."""
        if width == H:
            return h
        if width not in widths:
            widths[width] = rnd(T, width)
        return widths[width]

    moe_args = None
    if cfg.n_experts:               # this point's routing of random rows, once: the experts op runs the same choice
        from .model import route

        rw, rids = route(K, lcfg, lw, h)
        moe_args = (rw, rids)
        touched = int(torch.unique(rids).numel()) if dev.type != "meta" else 0
        counts = torch.bincount(rids.reshape(-1).long(), minlength=cfg.n_experts) if touched else None  # = moe_align's
        imbalance = round(float(counts.max()) / float(counts[counts > 0].float().mean()), 4) if touched else 0.0
    ep = tp is not None and tp.ep > 1 and bool(cfg.n_experts)
    if ep:                          # expert parallel: this rank's dispatch of the point's routing
        from .tp import dispatch_plan, local_experts

        plan = dispatch_plan(rw, rids, tp.world, tp.rank, sh.n_experts)
    mla_state = None
    if cfg.mla:                     # the latent cache of this point, and the attention closure (naive / absorbed)
        from .model import mla_decode_attend, mla_prefill_attend

        ckv, kpe = rnd(B, kv_len, cfg.kv_lora_rank), rnd(B, kv_len, cfg.qk_rope_dim)
        mla_att = (mla_prefill_attend(K, lcfg, slots, 0, n) if phase == "prefill"
                   else mla_decode_attend(K, lcfg, pos + 1, slots, kv_len))
        q_nope, q_pe = rnd(T, Hq, cfg.qk_nope_dim), rnd(T, Hq, cfg.qk_rope_dim)
        k_pe, c_lat = rnd(T, 1, cfg.qk_rope_dim), rnd(T, cfg.kv_lora_rank)
        mla_state = (ckv, kpe, mla_att, q_nope, q_pe, k_pe, c_lat)

    def runner(spec):
        kind, d = spec.kind, spec.dims
        if kind == "embedding":
            if tp is None:
                return (lambda: K.embedding(ids, w["embed"])), {}
            return (lambda: embed_local(K, ids, w["embed"], sh.vocab_rows(tp.rank))), {}
        if kind == "scale":
            s_ = torch.tensor(d["factor"], dtype=dt, device=dev)
            return (lambda: x * s_), {}
        if kind == "norm":
            key = spec.weights[0].key
            nw = w[key] if key in w else lw[key]
            if spec.part == "post":
                return (lambda: K.rmsnorm(last, nw, cfg.rms_eps)), {}
            if d["rows"] > 1:                                   # qk-norm: each head's D features
                src = (q if spec.name == "q_norm" else k).view(-1, D)
                return (lambda: K.rmsnorm(src, nw, cfg.rms_eps)), {}
            src = rows_of(d["width"])
            return (lambda: K.rmsnorm(src, nw, cfg.rms_eps)), {}
        if kind == "linear":
            if spec.part == "post":
                return (lambda: K.linear(last, w["lm_head"])), lin_cfg(B, w["lm_head"])
            wk = spec.weights[0].key
            bias = lw.get(spec.weights[1].key) if len(spec.weights) > 1 else None
            src = lin_in.get(spec.name)
            if src is None or src.shape[1] != d["in_features"]:   # MLA's, the shared expert's: their own width
                src = rows_of(d["in_features"])
            wt = lw[wk]
            fn = (lambda: K.linear(src, wt)) if bias is None else (lambda: K.linear(src, wt, bias=bias))
            return fn, lin_cfg(T, wt) | ({"bias": True} if bias is not None else {})
        if kind == "rope" and cfg.mla:
            _, _, _, _, qpe, kpe_new, _ = mla_state
            return (lambda: K.rope(qpe, kpe_new, cos, sin, pos)), {}
        if kind == "rope":
            return (lambda: K.rope(q, k, cos, sin, pos)), {}
        if kind == "latent_append":
            ckv_, kpe_, _, _, _, kpe_new, c_ = mla_state

            def append():
                ckv_[tok_slot, pos] = c_
                kpe_[tok_slot, pos] = kpe_new[:, 0]
            return append, {}
        if kind == "mla_up":             # decode: the absorption GEMMs; prefill: every key's K and V
            wkv = lw["wkv_b"]                # prefill: quantized or float; decode: a float (dequantized) copy
            if phase == "decode":
                wb = decode_kv_b(lw).view(cfg.kv_lora_rank, Hq, cfg.qk_nope_dim + cfg.v_head_dim)
                qn, ol = mla_state[3], rnd(T, Hq, cfg.kv_lora_rank)

                def absorb():
                    torch.einsum("bhn,rhn->bhr", qn, wb[..., :cfg.qk_nope_dim])
                    return torch.einsum("bhr,rhv->bhv", ol, wb[..., cfg.qk_nope_dim:])
                return absorb, {"form": "absorbed (q W_UK, o W_UV)"} | (
                    {"weights": f"{wdt} kv_b_proj dequantized at load ({dname})"} if qw else {})
            lat = rows_of(cfg.kv_lora_rank) if n == kv_len else rnd(B * kv_len, cfg.kv_lora_rank)
            return (lambda: K.linear(lat, wkv)), {"form": "naive (every key up-projected)"} | (
                lin_cfg(lat.shape[0], wkv) if qw else {})
        if kind == "mla_attention":      # the attention alone: its kv_b_proj work is mla_up's runner (and cost)
            ckv_, kpe_, _, _, qpe, _, _ = mla_state
            R, N, V = cfg.kv_lora_rank, cfg.qk_nope_dim, cfg.v_head_dim
            if phase == "decode":        # the absorbed query [T, Hq, R] over the latent cache
                q_lat, lens_ = rnd(T, Hq, R), pos + 1
                return ((lambda: K.mla_decode(q_lat, qpe, ckv_, kpe_, lens_, slots, sm_scale=cfg.scale,
                                              max_len=kv_len)),
                        {"form": "absorbed decode (Triton mla_decode)" if K.name == "triton"
                         else "absorbed decode (torch path)"})
            # naive prefill: per-head q [B, n, Hq, N + P] against every key's up-projected K and V
            qf, kf, vf = rnd(B, n, Hq, N + cfg.qk_rope_dim), rnd(B, kv_len, Hq, N + cfg.qk_rope_dim), rnd(B, kv_len,
                                                                                                       Hq, V)
            return (lambda: K.mla_prefill(qf, kf, vf, sm_scale=cfg.scale, cached=0)), {
                "form": "naive prefill (torch SDPA path)"}
        if kind == "router":
            from .model import route

            return (lambda: route(K, lcfg, lw, h)), {"router": cfg.router}
        if kind == "experts" and ep:
            return _ep_experts_runner(K, cfg, lw, h, plan, sh, tp.rank, dev,
                                      dict(weight_dtype=wdt, group_size=gsize, zero_point=kw["zero_point"]))
        if kind == "experts":
            e_kw = dict(activation=cfg.expert_activation, b_gate=lw.get("experts_gate_bias"),
                        b_up=lw.get("experts_up_bias"), b_down=lw.get("experts_down_bias"))
            return ((lambda: K.moe_experts(h, lw["experts_gate"], lw["experts_up"], lw["experts_down"], *moe_args,
                                           **e_kw)),
                    {"experts_touched": touched, "of": cfg.n_experts, "expert_imbalance": imbalance,
                     "routing": "this point's own (random rows through the layer's router)"}
                    | expert_weights_config(lw["experts_gate"], K.name))
        if kind == "gate":
            gv = lw["ws_gate_vec"]
            return (lambda: torch.sigmoid(K.linear(h, gv)) * x), {}
        if kind == "kv_append":
            return ((lambda: K.kv_append(k, v, k_cache, v_cache, tok_slot, pos, **skw)),
                    {"kv_cache": kv_cfg["kv_cache"]} if qkv else {})
        if kind == "attention":
            akw = attention_options(cfg, spec.layers[0])
            extra = {key: val for key, val in akw.items() if key != "sm_scale"}
            if "sinks" in lw:          # GPT-OSS: the Triton kernels' SINKS variant, or the torch path (kernels.sinks)
                akw["sinks"] = lw["sinks"]
                extra = extra | {"sinks": "Triton kernel" if K.name == "triton" else "torch path (kernels.sinks)"}
            return ((lambda: attend(q, k_cache, v_cache, **skw, **akw)),
                    (attn_cfg if K.name == "triton" else {}) | kv_cfg | extra)
        if kind == "residual":
            return (lambda: K.residual_add(x, r)), {}
        if kind == "activation" and d["width"] != I:    # a shared expert's (its own width)
            g2, u2 = rnd(T, d["width"]), rnd(T, d["width"])
            return (lambda: K.swiglu(g2, u2)), {}
        if kind == "activation":
            return (lambda: act_fn(gate, up)), {}
        if kind == "softcap":
            c = d["cap"]
            return (lambda: torch.tanh(logits / c) * c), {}
        raise RooflineError(f"op {spec.name!r} of kind {kind!r} has no runner")

    table = {name: runner(spec) for name, spec in specs.items() if name in names}
    first = 0                                         # the layer op times layer 0 (its window)
    layer_caches = (mla_state[0], mla_state[1], mla_state[2]) if cfg.mla else (k_cache, v_cache, attend)
    layer_ops = K
    if ep:                          # the layer runs this rank's experts on the rows routed to them, no all-to-all
        from functools import partial
        from types import SimpleNamespace

        layer_ops = SimpleNamespace(**{**vars(K), "moe_experts": partial(local_experts, K.moe_experts, tp.rank)})
    table["layer"] = (lambda: transformer_layer(layer_ops, lcfg, lw, x, cos, sin, pos, tok_slot, *layer_caches,
                                                kv_scales=kv_scales, attn_kw=attention_options(cfg, first)),
                      ({"attention": attn_cfg} if K.name == "triton" else {})
                      | ({"collectives": "not included: timed as attn_allreduce, mlp_allreduce"} if tp else {})
                      | ({"weights": lin_cfg(T, lw["wo"])["weights"]} if qw else {})
                      | ({"kv_cache": kv_cfg["kv_cache"]} if qkv else {})
                      | ({"layer": "the first layer's attention (window "
                                   f"{cfg.windows[first] or 'none'}); layers differ"} if len(set(cfg.windows)) > 1
                         else {}))
    if tp is not None:
        table.update(_collective_runners(ph, tp, torch.zeros(T, H, device=dev, dtype=dt),
                                         torch.zeros(B, sh.vocab, device=dev, dtype=dt), plan if ep else None))

    out = []
    for name in names:
        fn, conf = table[name]
        if name in COLLECTIVE_OPS + EP_COLLECTIVES:
            out.append(OpRunner(name, fn, Cost(0, 0), dname, {"backend": K.name, "dtype": dname, **conf},
                                ("communication",)))
            continue
        cost, cdt = ph.op(name).cost, ph.op(name).compute_dtype
        if name == "experts" and ep:                  # this rank's own load: the rows this point routed to it
            cost = conf.pop("cost")
        out.append(OpRunner(name, fn, cost, cdt, {"backend": K.name, "dtype": dname, **conf}))
    return out


def _collective_runners(ph, tp, hidden, logits, plan=None) -> dict:
    """The step's collectives on preallocated buffers (zeros: a collective's time does not depend on values):
    all-reduces of [T, H] in place, the all-gather of this rank's [B, V/N] logits; under expert parallelism the
    dispatch and combine all-to-alls with the split sizes of this point's routing (``plan``: kernels.tp.Dispatch),
    the rows this rank sends in ``sent_bytes`` beside the model's ``message_bytes``."""
    out = {}
    for c in ph.collectives:
        extra = {}
        if c.kind == "all_to_all":
            send, recv = (plan.send, plan.recv) if c.name == "moe_dispatch" else (plan.recv, plan.send)
            buf = hidden.new_zeros(sum(send), hidden.shape[1])
            fn = (lambda b=buf, o=recv, i=send: tp.all_to_all(b, o, i))
            extra = {"sent_bytes": buf.numel() * buf.element_size(), "rows_sent": list(send)}
        elif c.kind == "all_reduce":
            fn = (lambda: tp.all_reduce(hidden))
        else:
            fn = (lambda: tp.all_gather_last(logits))
        out[c.name] = (fn, {"detail": {"collective": c.kind, "group_size": c.ranks, "message_bytes": c.message_bytes,
                                       "wire_bytes": c.wire_bytes, "shape": c.shape, **extra}})
    return out


def _ep_experts_runner(K, cfg: ModelConfig, lw: dict, h, plan, sh, rank: int, dev, wq: dict) -> tuple:
    """(fn, config with its "cost") of one rank's routed experts under expert parallelism: its E/N experts on the
    rows this point's routing dispatches to it (each weighted by its routing weight), then the sum of its owned
    tokens' k returned partials; the cost is ``formulas.moe_experts_ep`` for exactly that load (the rows and the
    distinct experts it saw)."""
    from roofline import formulas as F

    from .tp import own_rows

    xs = h[plan.recv_tok]
    back = h.new_zeros(sum(plan.send), h.shape[1])              # the combine's returned partials
    T = h.shape[0]
    own = h.new_zeros(len(own_rows(T, sh.tp, rank)), h.shape[1])
    e_kw = dict(activation=cfg.expert_activation, b_gate=lw.get("experts_gate_bias"),
                b_up=lw.get("experts_up_bias"), b_down=lw.get("experts_down_bias"))
    rows, ids_, w_ = xs.shape[0], plan.recv_ids[:, None], plan.recv_w

    def fn():
        if rows:
            K.moe_experts(xs, lw["experts_gate"], lw["experts_up"], lw["experts_down"], w_, ids_, **e_kw)
        own.zero_().index_add_(0, plan.token, back)

    distinct = int(torch.unique(plan.recv_ids).numel()) if dev.type != "meta" else 0
    wg = lw["experts_gate"]
    cost = F.moe_experts_ep(T, cfg.hidden, cfg.moe_intermediate, cfg.n_experts, cfg.n_active, sh.ep, rows=rows,
                            distinct=distinct, activation=cfg.expert_activation, bias=cfg.expert_bias,
                            act_dtype=dtype_name(h.dtype), **wq)
    return fn, {"cost": cost, "experts_touched": distinct, "of": sh.n_experts, "rows": rows,
                "routing": "this point's own (random rows through the layer's router), dispatched to this rank's "
                           f"experts {sh.experts(rank).start}..{sh.experts(rank).stop - 1}"} | expert_weights_config(
        wg, K.name)
