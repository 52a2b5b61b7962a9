"""A hybrid's decode step against context, beside its dense counterpart (issue 32; ``roofline explain
--vs-context``, the report's decode-vs-context figure).

A Gated DeltaNet layer (Qwen3-Next, Qwen3.5) reads a fixed-size state at decode, not a KV cache that grows with
the context; DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5) caps the latent KV read at ``index_topk`` tokens, its
indexer reading every key (fp8, 132 bytes per token and layer). ``dense_counterpart(cfg)`` is the one function
that builds the model they are measured against: the same config with every linear-attention layer as full
attention (its heads, KV heads and head width, its output gate: what the config's full-attention layers are), or
dense MLA over every token with no indexer; everything else (the MLP or experts, the embedding, the precision) is
unchanged, so its weights differ from the model's by the layers changed (a DeltaNet layer's projections against
an attention layer's; the indexer's).

``context_curve(spec)`` prices one decode step of each (``roofline.workload.decode``, each op at its roof:
``bounds.analyze_phase``) at contexts 1,024, 2,048, ... up to the model's last decode step (max context - 1),
with the bytes it reads per kind (weights, KV, state, indexer keys, the rest), and the smallest context from which
the model's step is at least 1x and ``faster`` x faster than its counterpart's (doubling and bisection over
1 .. max context - 1: the speedup grows with the context, the model's bytes per added token being fewer).
Returns typed data (``ContextCurve``); ``to_dict`` is what ``--json`` prints, ``context_curve_text`` what
``explain`` prints. Nothing here measures.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from . import units as U
from . import workload as W
from .bounds import analyze_phase, crossing
from .errors import RooflineError
from .models import MAMBA_FIELDS, ModelConfig

FIRST_CONTEXT = 1024     # the curve's first context; then powers of two up to the model's last decode step
FASTER = 2.0             # the default speedup whose context is searched (``--faster``)


def linear_kind(cfg: ModelConfig) -> str:
    """The kind of layer that makes ``cfg`` cheaper than dense attention at long context: "linear" (a fixed-size
    state: Gated DeltaNet or Mamba-2 layers), "sparse" (DeepSeek Sparse Attention), or "" (every layer attends
    densely)."""
    return "linear" if cfg.linear_layers or cfg.mamba_layers else "sparse" if cfg.index_topk else ""


STATE_TYPES = ("linear", "mamba", "hybrid")   # layer_types whose mixer keeps a state (hybrid: Mamba-2 beside attention)


def dense_counterpart(cfg: ModelConfig) -> ModelConfig:
    """``cfg`` with dense attention in every layer (module docstring): its "linear" layers as "full" (the linear_*
    sizes cleared), or its indexer removed (MLA over every token). A RooflineError for a model that has
    neither."""
    kind = linear_kind(cfg)
    if kind == "linear":
        types = tuple("full" if t in STATE_TYPES else t for t in cfg.layer_types)
        return replace(cfg, name=f"{cfg.name} (dense counterpart)", layer_types=types, linear_k_heads=0,
                       linear_v_heads=0, linear_k_dim=0, linear_v_dim=0, linear_conv=0,
                       **{f: 0 for f in MAMBA_FIELDS}, checkpoint="", notes=())
    if kind == "sparse":
        return replace(cfg, name=f"{cfg.name} (dense counterpart)", index_topk=0, index_n_heads=0, index_head_dim=0,
                       index_shared=(), checkpoint="", notes=())
    raise RooflineError(f"{cfg.name} attends densely in every layer, so it has no dense counterpart to be compared "
                        "with: --vs-context takes a model with linear-attention layers (qwen3_next, qwen3_5), Mamba-2 "
                        "layers (nemotron_h, granitemoehybrid, falcon_h1) or sparse attention (deepseek_v32, "
                        "glm_moe_dsa).")


def counterpart_said(cfg: ModelConfig) -> str:
    """How ``dense_counterpart(cfg)`` is made, in one sentence."""
    if linear_kind(cfg) == "linear":
        what = (f"{len(cfg.linear_layers)} Gated DeltaNet layers" if cfg.linear_layers else
                f"{len(cfg.mamba_layers)} Mamba-2 layers" + (" (those beside attention dropped)"
                                                             if "hybrid" in cfg.layer_types else ""))
        a = len(dense_counterpart(cfg).attention_layers)
        return (f"the same config with its {what} as full attention: {a} attention layers of "
                f"{cfg.n_heads} query and {cfg.n_kv_heads} KV heads x {cfg.head_dim}"
                + (" (gated output)" if cfg.attn_gate else "") + ", no recurrent state, the MLPs unchanged")
    return (f"the same config with dense MLA: every one of its {cfg.n_layers} layers attends to every earlier token's "
            f"latent ({cfg.kv_lora_rank} + {cfg.qk_rope_dim} wide), no indexer (its top-{cfg.index_topk:,} "
            "selection and key cache removed), the MLPs unchanged")


def curve_contexts(cfg: ModelConfig, first: int = FIRST_CONTEXT) -> tuple:
    """Powers of two from ``first`` while a decode step fits (context + 1 <= max_context), then the last one the
    model allows (max_context - 1) when it is not a power of two."""
    last = cfg.max_context - 1
    out, c = [], first
    while c <= last:
        out.append(c)
        c *= 2
    if last >= first and out[-1] != last:
        out.append(last)
    return tuple(out)


@dataclass(frozen=True)
class StepBytes:
    """One decode step at its roof: its time, and the bytes it reads by kind."""

    context: int
    time_s: float            # the ops' roof times summed (and the collectives', under --tp)
    bound: str               # the step's summed intensity against the ridge
    flops: float
    bytes: float             # everything the step moves
    weight_bytes: float
    kv_bytes: float          # KV (latent) cache read
    state_bytes: float       # Gated DeltaNet or Mamba-2 state read (recurrent + conv), constant in the context
    index_bytes: float       # DeepSeek Sparse Attention's indexer keys read

    @property
    def other_bytes(self) -> float:
        """Activations, the new token's cache writes, scores: what the kinds above leave."""
        return self.bytes - self.weight_bytes - self.kv_bytes - self.state_bytes - self.index_bytes

    def to_dict(self) -> dict:
        return {"context": self.context, "time_s": self.time_s, "bound": self.bound, "flops": self.flops,
                "bytes": self.bytes, "weight_bytes": self.weight_bytes, "kv_bytes": self.kv_bytes,
                "state_bytes": self.state_bytes, "index_bytes": self.index_bytes, "other_bytes": self.other_bytes}


@dataclass(frozen=True)
class ContextCurve:
    model: str
    counterpart: str
    kind: str                # "linear" | "sparse" (``linear_kind``)
    said: str                # how the counterpart is made (``counterpart_said``)
    device: str
    device_source: str
    batch: int
    act_dtype: str
    weights: str             # the weights' label (bf16, checkpoint, module=format,...)
    kv_said: str             # the KV cache's format, in words
    parallel: str            # "" on one device, else how the ranks split it ("every figure is one rank's")
    max_context: int
    hybrid: tuple            # StepBytes per context
    dense: tuple             # StepBytes per context, the counterpart's
    faster: float            # the speedup whose context is searched
    crossings: tuple         # ((speedup, smallest context reaching it, or None), ...) for 1 and ``faster``

    @property
    def contexts(self) -> tuple:
        return tuple(p.context for p in self.hybrid)

    @property
    def speedups(self) -> tuple:
        """The counterpart's step time over the model's, per context."""
        return tuple(d.time_s / h.time_s for h, d in zip(self.hybrid, self.dense))

    def faster_from(self, x: float):
        """The smallest context from which the model's step is at least ``x`` times faster (None: not by
        max_context - 1)."""
        return dict(self.crossings).get(x)

    def to_dict(self) -> dict:
        return {"model": self.model, "counterpart": self.counterpart, "kind": self.kind, "counterpart_said": self.said,
                "device": self.device, "device_source": self.device_source, "batch": self.batch,
                "act_dtype": self.act_dtype, "weights": self.weights, "kv": self.kv_said, "parallel": self.parallel,
                "max_context": self.max_context, "faster": self.faster,
                "rows": [{"context": h.context, "model": h.to_dict(), "dense": d.to_dict(), "speedup": s}
                         for h, d, s in zip(self.hybrid, self.dense, self.speedups)],
                "crossings": [{"speedup": x, "context": c} for x, c in self.crossings]}


def context_curve(spec, faster: float = FASTER, contexts=None) -> ContextCurve:
    """``spec``'s model (a ``roofline.explain.ExplainSpec``: its device, batch and precision; its phase and
    context are not used) against ``dense_counterpart`` of it, one decode step each per context (default
    ``curve_contexts``); the crossings searched as the module docstring says."""
    if spec.mix is not None or spec.phase != "decode":
        raise RooflineError("--vs-context prices decode steps across context: drop --mix, --phase prefill, --cached "
                            "and --chunk.")
    if not faster >= 1:
        raise RooflineError(f"--faster is the speedup whose context is searched, at least 1 (e.g. 2), not {faster!r}.")
    m = spec.model
    dense = replace(spec, model=dense_counterpart(m))
    last = m.max_context - 1
    ctxs = tuple(contexts) if contexts is not None else curve_contexts(m)
    if not ctxs:
        raise RooflineError(f"{m.name}'s maximum context ({m.max_context:,}) leaves no decode step at "
                            f"{FIRST_CONTEXT:,} tokens or more: --vs-context needs a longer model.")
    opts, dense_opts = spec._step_options(), dense._step_options()

    def step(cfg, o, c) -> StepBytes:
        ph = W.decode(cfg, spec.batch, c, **o)
        v = analyze_phase(ph, spec.device, spec.link)
        return StepBytes(c, v.step_time_s, v.bound, ph.total.flops, ph.total.bytes, ph.weight_bytes,
                         float(ph.kv_cache_read_bytes), float(ph.state_read_bytes), float(ph.index_read_bytes))

    def speedup(c) -> float:
        c = min(c, last)
        return step(dense.model, dense_opts, c).time_s / step(m, opts, c).time_s

    marks = (1.0, float(faster)) if faster != 1 else (1.0,)
    crossings = tuple((x, crossing(speedup, x, limit=last)) for x in marks)
    crossings = tuple((x, min(c, last) if c is not None else None) for x, c in crossings)
    ph = W.decode(m, spec.batch, ctxs[0], **opts)
    parallel = (f"expert parallel over {ph.ep} ranks" if ph.ep > 1 else f"tensor parallel over {ph.tp} ranks"
                if ph.tp > 1 else "")
    return ContextCurve(m.name, dense.model.name, linear_kind(m), counterpart_said(m), spec.device.name,
                        spec.device.source, spec.batch, ph.dtypes.act, spec.weight_label,
                        ph.dtypes.precision.describe_kv(ph.dtypes.act),
                        f"{parallel}: every figure is one rank's" if parallel else "", m.max_context,
                        tuple(step(m, opts, c) for c in ctxs), tuple(step(dense.model, dense_opts, c) for c in ctxs),
                        float(faster), crossings)


def context_curve_text(c: ContextCurve) -> str:
    """What ``roofline explain --vs-context`` prints: the settings and the counterpart, the curve (time and bytes
    by kind of each, the speedup), and the contexts from which the model's step is faster."""
    extra, extra_of = ("state", "state_bytes") if c.kind == "linear" else ("index keys", "index_bytes")
    lines = [f"Decode against context: {c.model} on {c.device} ({c.device_source} ceilings), batch {c.batch}, weights "
             f"{c.weights}, activations {c.act_dtype}, {c.kv_said}" + (f"; {c.parallel}" if c.parallel else "")
             + "; each step at its roof (max(FLOPs / peak, bytes / bandwidth) per op, summed).",
             f"Beside its dense counterpart: {c.said}.",
             f"{'':>8} {'model':^52} {'dense counterpart':^39}",
             f"{'context':>8} {'time':>9} {'weights':>10} {'KV':>10} {extra:>10} {'total':>10} "
             f"{'time':>9} {'weights':>10} {'KV':>10} {'total':>10} {'speedup':>8}"]
    for h, d, s in zip(c.hybrid, c.dense, c.speedups):
        lines.append(f"{h.context:>8,} {U.seconds(h.time_s):>9} {U.nbytes(h.weight_bytes):>10} "
                     f"{U.nbytes(h.kv_bytes):>10} {U.nbytes(getattr(h, extra_of)):>10} {U.nbytes(h.bytes):>10} "
                     f"{U.seconds(d.time_s):>9} {U.nbytes(d.weight_bytes):>10} {U.nbytes(d.kv_bytes):>10} "
                     f"{U.nbytes(d.bytes):>10} {s:>7.2f}x")
    lines.append("(total: every byte the step moves, activations and the new token's cache writes included"
                 + ("; the state is written back once too." if c.kind == "linear" else
                    "; the indexer's fp32 scores written and read back by its top-k too." if c.kind == "sparse"
                    else ".") + ")")
    last = c.max_context - 1
    said = []
    for x, ctx in c.crossings:
        what = "at least as fast as its dense counterpart's" if x == 1 else f"{x:g}x faster"
        said.append(f"from context {ctx:,} it is {what}" if ctx is not None else
                    f"it is never {what} up to context {last:,} ({c.speedups[-1]:.2f}x at {c.contexts[-1]:,})")
    lines.append(f"{c.model}'s decode step: " + "; ".join(said) + f" (each the smallest such context, by doubling "
                 f"and bisection over 1 ... {last:,}).")
    return "\n".join(lines)
