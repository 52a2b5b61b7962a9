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

Each op kind's runner is an entry of ``kernels.runner_registry`` (``@runner(kind)``, in ``kernels.runners_*``),
built from the point's ``kernels.runner_context.RunContext``; ``make_runners`` loops over the model's ops.

Precision (``kernels.run_precision``): each module as the checkpoint stores it (a quantized checkpoint's own
formats: its FP8 blocks, MXFP4 experts, ...), or as ``weight_dtype`` / ``kv_dtype`` say over it; the one-layer
weights are the same seeded (or the checkpoint's) weights held per module in that format (``kernels.quant``), an
8-bit KV cache has per-token scales, and costs are the workload's for that precision (scales counted). A linear's config says
which kernel ran: the Triton kernel's tiles, or ``impl`` on the torch backend (the ecosystem op, or a
dequantize reference, said so).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from types import SimpleNamespace
from typing import Callable

import torch

from roofline import workload as W
from roofline.cost import Cost
from roofline.errors import RooflineError
from roofline.layer import model_ops
from roofline.models import ModelConfig
from roofline.parallel import COLLECTIVE_OPS, EP_COLLECTIVES
from roofline.speculative import verify_step

from . import (runners_attention, runners_deltanet, runners_dsa, runners_mamba, runners_mla,  # noqa: F401
               runners_moe, runners_rows)  # (each registers its kinds)
from ._common import dtype_name, torch_dtype
from .backend import get_ops
from .model import DeltaState, MambaState, attention_options, transformer_layer
from .runner_context import RunContext, build_context
from .run_precision import check_run, check_tp, run_precision
from .runner_registry import builder
from .tp import local_experts, tp_parts

COLLECTIVES = COLLECTIVE_OPS + EP_COLLECTIVES
PHASES = ("prefill", "decode", "verify")   # verify: speculative decoding's verify step (``spec_k`` drafts)


@dataclass
class OpRunner:
    name: str                  # an op of roofline.layer.model_ops(cfg), or "layer"
    fn: Callable[[], object]   # runs the op once on preallocated inputs
    cost: Cost                 # one instance, from roofline.workload
    compute_dtype: str         # the Phase op's compute_dtype ("layer": the activation dtype)
    config: dict = field(default_factory=dict)  # backend, block sizes, split count ...
    flags: tuple = ()          # ("communication",) for a collective: kept off the HBM roofline


def make_runners(cfg: ModelConfig, phase: str, batch: int, context: int, *, dtype="bf16", backend="triton",
                 device="cpu", seed=0, ops=None, tp=None, weight_dtype=None, kv_dtype=None, group_size=None,
                 zero_point=False, spec_k: int = 0) -> list[OpRunner]:
    """Runners for every op of ``phase`` (or only ``ops``), in the model's op order then "layer" (then, under
    tensor parallelism, the collectives). The weights and KV cache are the checkpoint's own precision per module
    as our kernels run it (``kernels.run_precision``), or the flags' over it: ``weight_dtype`` a registered format
    for every projection, MLP, expert and lm_head ("int8", "int4" with ``group_size`` and ``zero_point``, "fp8",
    "fp8-block", "mxfp4", "nvfp4"; the activation dtype: unquantized) or ``module=format`` pairs
    ("experts=nvfp4,attention=fp8"); ``kv_dtype`` an 8-bit cache (int8, fp8) or the activation dtype. Every cost is
    of what runs (``roofline.workload`` with that precision). Phase "verify": speculative decoding's verify step of
    ``spec_k`` drafts (k + 1 tokens per sequence after ``context``, logits at each; costs
    ``roofline.speculative.verify_step``'s)."""
    if phase not in PHASES:
        raise RooflineError(f"phase must be one of {', '.join(PHASES)}, not {phase!r}.")
    if (phase == "verify") != bool(spec_k) or isinstance(spec_k, bool) or not isinstance(spec_k, int) or spec_k < 0:
        raise RooflineError(f"a verify step needs spec_k, its drafts, a whole number of at least 1 (and only a verify "
                            f"step takes one): got phase {phase!r} with spec_k {spec_k!r}.")
    if phase == "verify" and cfg.mla:
        raise RooflineError(f"{cfg.name}'s latent attention has no verify-step runner (its verify step is costed as "
                            "a prefill chunk, roofline.speculative.verify_notes): profile it without --spec.")
    if phase == "verify" and any(cfg.chunks):
        raise RooflineError(f"{cfg.name}'s chunked local attention (Llama-4) has no verify-step kernel yet "
                            "(decode_attention.verify_attention takes a window, not a chunk): profile it without "
                            "--spec.")
    tp = tp if tp is not None and tp.world > 1 else None
    specs = {o.name: o for o in model_ops(cfg, tp_parts(cfg, tp)[0])}
    names = _chosen(list(specs) + ["layer"] + (list(COLLECTIVES) if tp is not None else []), ops)
    dt = torch_dtype(dtype)
    dev = torch.device(device)
    prec = run_precision(cfg, dtype_name(dt), weight_dtype, kv_dtype, group_size=group_size, zero_point=zero_point)
    kvdt = check_run(prec, cfg, get_ops(backend).name, dev, kv_dtype)
    if tp is not None:
        check_tp(prec, cfg, tp.world)
    kw = dict(weight_dtype=prec.weight_label, act_dtype=dtype_name(dt), kv_dtype=kvdt,
              tp=tp.world if tp is not None else 1, ep=tp.ep if tp is not None else 1, precision=prec.run)
    ph = (W.prefill(cfg, batch, context, **kw) if phase == "prefill" else W.decode(cfg, batch, context, **kw)
          if phase == "decode" else verify_step(cfg, batch, context, spec_k, **kw))
    if tp is not None:                                # the step's own collectives (under --ep: the all-to-alls)
        names = [n for n in names if n not in COLLECTIVES] + [c.name for c in ph.collectives if c.name in names]
    K = get_ops(backend)
    ctx = build_context(cfg, phase, batch, context, K=K, dt=dt, dev=dev, seed=seed, tp=tp, prec=prec, kvdt=kvdt,
                        spec_k=spec_k)
    table = {name: builder(spec.kind)(ctx, spec) for name, spec in specs.items() if name in names}
    table["layer"] = _layer_runner(ctx)
    if cfg.linear_layers or cfg.mamba_layers:   # a hybrid's "layer" runs layer 0: its own ops' cost, not the mean
        table["layer"][1]["cost"] = sum((ph.op(s.name).cost for s in specs.values() if s.per_layer and 0 in s.layers),
                                        Cost(0, 0))
    if tp is not None:
        table.update(_collective_runners(ph, tp, torch.zeros(ctx.T, cfg.hidden, device=dev, dtype=dt),
                                         torch.zeros(len(ctx.last), ctx.sh.vocab, device=dev, dtype=dt),
                                         ctx.routing.plan if ctx.ep else None))
    out = []
    for name in names:
        fn, conf = table[name]
        base = {"backend": K.name, "dtype": ctx.dname}
        if name in COLLECTIVES:
            out.append(OpRunner(name, fn, Cost(0, 0), ctx.dname, {**base, **conf}, ("communication",)))
            continue
        cost = conf.pop("cost") if "cost" in conf else ph.op(name).cost   # a runner's own load (expert parallelism)
        said = [n for n in ctx.load_notes if n.startswith(f"{specs[name].module}:")] if name in specs else []
        out.append(OpRunner(name, fn, cost, ph.op(name).compute_dtype,
                            {**base, **conf, **({"checkpoint": " ".join(said)} if said else {})}))
    return out


def _chosen(names: list, ops) -> list:
    """``names`` in their order, only ``ops`` when given (an unknown one refused in one line)."""
    if ops is None:
        return names
    bad = [o for o in ops if o not in names]
    if bad:
        raise RooflineError(f"unknown op {bad[0]!r}: choose from {', '.join(names)}.")
    return [n for n in names if n in ops]


def _layer_runner(ctx: RunContext) -> tuple:
    """(fn, config) of "layer": one whole transformer layer (the model's own ``transformer_layer``) on the
    point's inputs; under expert parallelism this rank's experts on the rows routed to them, no all-to-all."""
    cfg, K, first = ctx.cfg, ctx.K, 0                 # the layer op times layer 0 (its window)
    caches = ((ctx.latent.ckv, ctx.latent.kpe, ctx.latent.attend) if ctx.latent is not None
              else (ctx.k_cache, ctx.v_cache, ctx.attend))
    layer_ops = K
    if ctx.ep:
        layer_ops = SimpleNamespace(**{**vars(K), "moe_experts": partial(local_experts, K.moe_experts, ctx.tp.rank)})
    # a Mamba-2 hybrid's layer 0 with its own weights (ctx.lw merges the picked layers': a mixer and an MLP each)
    lw = ctx.w["layers"][0] if cfg.mamba_layers else ctx.lw
    cos, sin = (None, None) if cfg.mamba_layers and first in cfg.nope_layers else (ctx.cos, ctx.sin)
    args = (layer_ops, ctx.lcfg, lw, ctx.x, cos, sin, ctx.pos, ctx.tok_slot, *caches)
    akw = dict(kv_scales=ctx.kv_scales, attn_kw=attention_options(cfg, first),
               index_cache=ctx.index.cache if ctx.index is not None else None)
    if first in cfg.linear_layers:     # a Gated DeltaNet layer: the point's states
        akw["delta"] = DeltaState(batch=ctx.B, slots=ctx.slots, decode=ctx.phase == "decode",
                                  has_state=ctx.phase == "decode", conv=ctx.delta.conv, state=ctx.delta.state)
    if first in cfg.mamba_layers:      # a Mamba-2 layer: the point's states
        akw["mamba"] = MambaState(batch=ctx.B, slots=ctx.slots, decode=ctx.phase == "decode",
                                  has_state=ctx.phase == "decode", conv=ctx.mamba.conv, state=ctx.mamba.state)
    conf = (({"attention": ctx.attn_cfg} if ctx.triton else {})
            | ({"collectives": "not included: timed as attn_allreduce, mlp_allreduce"} if ctx.tp else {})
            | ({"weights": ctx.prec.describe()} if ctx.qw else {})
            | ({"kv_cache": ctx.kv_cfg["kv_cache"]} if ctx.qkv else {})
            | ({"layer": "layer 0, Gated DeltaNet: its own ops' cost"} if first in cfg.linear_layers else {})
            | ({"layer": f"layer 0, {'Mamba-2 beside attention' if cfg.layer_types[0] == 'hybrid' else 'Mamba-2'}: "
                         "its own ops' cost"} if first in cfg.mamba_layers else {})
            | ({"layer": "the first layer's attention (window "
                         f"{cfg.windows[first] or 'none'}); layers differ"} if len(set(cfg.windows)) > 1 else {}))
    return (lambda: transformer_layer(*args, **akw)), conf


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
