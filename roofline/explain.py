"""Analytic explanations, no hardware: the back-of-the-envelope arithmetic for one linear layer, a phase's
per-op table with its verdict, and a whole ``roofline explain`` of a model step (``ExplainSpec``,
built once from the options, into ``explain_step``: the table, the capacity, the expert curve).
``spec_curve``: plain decode against speculative decoding across batch (``roofline explain --spec``,
``roofline.speculative``). Returns data and plain text; the CLI prints."""

from __future__ import annotations

from dataclasses import dataclass, replace

from . import formulas as F
from . import speculative as S
from . import units as U
from . import workload as W
from .bounds import COMMUNICATION, COMPUTE, analyze_phase, crossing
from .capacity import Capacity, capacity, weight_bytes_by_module
from .devices import Device
from .dtypes import bytes_per_element, normalize_dtype
from .errors import RooflineError, check_positive_int
from .layer import module_classes, precision_of
from .models import ModelConfig
from .precision import INT4_GROUPS, Precision, gemm_compute, lookup, weight_bytes, weight_format
from .precision.formats import PLAIN, paired_act




def explain_linear(tokens: int, in_features: int, out_features: int, dtype: str, device: Device, *,
                   weight_dtype: str | None = None, act_dtype: str | None = None,
                   group_size: int | None = None, zero_point: bool = False) -> dict:
    """The back-of-the-envelope walk-through for y[T, N] = x[T, K] @ W[K, N]: returns figures and ``text``.

    ``dtype`` is the layer's format (``roofline.precision``'s registry: a float, or a weight format such as fp8,
    fp8-block, mxfp4, nvfp4, int8, int4); ``weight_dtype`` (default ``dtype``) and ``act_dtype`` (a float; default
    ``dtype`` when it is one, else bf16) override one side. A weight format whose GEMM has a rate of its own (fp8,
    FP4) given as ``dtype`` runs with activations in its matching format (W8A8, W4A4) at that rate where the
    device has it (``formats.gemm_compute``); given as ``weight_dtype`` (or int8 / int4) it is weight-only,
    dequantized into the activation dtype, so the ridge is the activation dtype's. The weight's bytes, scales
    included, are ``formats.weight_bytes``; a group size or block that does not tile K is a RooflineError.
    """
    T = check_positive_int("--tokens", tokens)
    K = check_positive_int("--in", in_features)
    N = check_positive_int("--out", out_features)
    layer = str(dtype).strip().lower()
    wf = weight_format(weight_dtype or layer, group_size, zero_point)
    act = normalize_dtype(act_dtype) if act_dtype else cost_act(wf.name if wf.name in PLAIN else layer)
    g = wf.group_size
    if g and K % g:
        fits = [x for x in INT4_GROUPS if K % x == 0]
        raise RooflineError(f"{wf.describe()}: its groups of {g} do not divide --in {K:,} (K): each column's K rows "
                            "are split into whole groups of one scale; "
                            + ((f"give --group-size {' or '.join(map(str, fits))}." if fits else
                                "no int4 group size (32, 64, 128) divides it: use --weight-dtype int8 or another --in.")
                               if wf.name == "int4" else f"give an --in that is a multiple of {g}."))
    paired = weight_dtype is None and wf.compute != "act"          # W8A8 / W4A4: the activations in its format
    af = (paired_act(wf) if paired else None) or lookup(act, "act")
    compute_dt = gemm_compute(wf, af, lambda d: d in device.peak_flops)
    b = wf.bits / 8
    w_bytes = K * N * b
    stored = weight_bytes(wf, K, N, act)
    scale_bytes = stored - w_bytes
    cost = F.linear(T, K, N, act_dtype=act, weight_bytes=stored)
    wi = 2 * T * K * N / w_bytes
    peak, bw = device.peak(compute_dt), device.bandwidth
    ridge = device.ridge(compute_dt)
    verdict = COMPUTE if cost.intensity >= ridge else "memory"
    tm = max(cost.flops / peak, cost.bytes / bw)
    kind = (f"{wf.describe()} weights, {af.describe() if af.name not in PLAIN else act} activations"
            if wf.name != act else act)
    lines = [
        f"Linear layer: x[{T:,}, {K:,}] @ W[{K:,}, {N:,}] in {kind} ({b:g} bytes per weight element)",
        f"  weight bytes      = {K:,} x {N:,} x {b:g} = {w_bytes:,.0f} bytes ({U.nbytes(w_bytes)})",
        f"  FLOPs, 1 token    = 2 x {K:,} x {N:,} = {2 * K * N:,} FLOPs",
        f"  FLOPs, {T:,} tokens = {T:,} x {2 * K * N:,} = {cost.flops:,.0f} FLOPs",
        f"  weight-only intensity = {cost.flops:,.0f} / {w_bytes:,.0f} = {wi:,.1f} FLOP/byte",
        f"  with activations  = {cost.flops:,.0f} / {cost.bytes:,.0f} bytes = {cost.intensity:,.1f} FLOP/byte "
        f"(adds x and y: {T:,} x ({K:,} + {N:,}) x {bytes_per_element(act):g} bytes"
        + (f", and the scales: {scale_bytes:,.0f} bytes)" if scale_bytes else ")"),
        f"  {device.name} ridge ({compute_dt}) = {U.flops_rate(peak)} / {U.bandwidth(bw)} = {ridge:,.1f} FLOP/byte "
        f"[{device.source}]",
        f"  verdict: {cost.intensity:,.1f} {'>=' if verdict == COMPUTE else '<'} {ridge:,.1f}, so it is "
        f"{verdict}-bound; at the roof it takes {U.seconds(tm)}.",
        "  (weight-only counts the weight bytes alone, the back-of-the-envelope figure; real kernels also move "
        "activations and attention state.)",
    ]
    return {"tokens": T, "in": K, "out": N, "dtype": layer, "weight_dtype": wf.name, "act_dtype": act,
            "act_format": af.name, "compute_dtype": compute_dt, "device": device.name, "weight_bytes": w_bytes,
            "scale_bytes": scale_bytes,
            "flops": cost.flops, "bytes": cost.bytes, "weight_only_intensity": wi, "intensity": cost.intensity,
            "ridge": ridge, "bound": verdict, "time_s": tm, "text": "\n".join(lines)}


def cost_act(dt: str) -> str:
    return dt if dt in ("fp32", "bf16", "fp16") else "bf16"


def explain_phase(phase, device: Device, link=None) -> dict:
    """The per-op table and the one-sentence verdict; the dict is what ``--json`` prints.

    Under tensor parallelism (``phase.tp`` > 1) the ops are one rank's share, and "collectives"
    lists each collective with its time over ``link`` (default: the device's interconnect);
    "communication" gives their time and share of the step (and, in "by_kind", each collective kind's:
    under expert parallelism, ``phase.ep`` > 1, the MoE layers' dispatch and combine all-to-alls), and the
    verdict says communication-bound when they take at least half of it.
    """
    v = analyze_phase(phase, device, link)
    ops = [{"name": o.name, "count": o.count, "flops": o.cost.flops, "bytes": o.cost.bytes,
            "intensity": o.cost.intensity, "bound": o.bound, "time_s": o.time_s} for o in v.ops]
    total = {"flops": v.total.flops, "bytes": v.total.bytes, "intensity": v.total.intensity,
             "bound": v.bound, "bound_by_mix": v.bound_by_mix, "compute_time_share": v.compute_time_share,
             "time_s": v.time_s}
    m = phase.model
    what = (f"prefill of {phase.batch} x {phase.context:,} tokens"
            + (f" ({phase.cached_tokens:,} cached)" if phase.cached_tokens else "")
            + (f" in {len(phase.chunks)} chunks" if len(phase.chunks) > 1 else "")
            if phase.phase == "prefill" else
            f"mixed step of {phase.batch} sequences, {phase.new_tokens:,} tokens through the linears, the longest "
            f"{phase.context:,}" if phase.phase == "mixed" else
            f"decode step at batch {phase.batch}, context {phase.context:,}")
    tp, ep = getattr(phase, "tp", 1), getattr(phase, "ep", 1)
    where = f"{device.name}" + (f" x {tp} (expert parallel: {m.n_experts // ep} whole expert{'s' if m.n_experts // ep > 1 else ''} per rank)" if ep > 1
                                else f" x {tp} (tensor parallel)" if tp > 1 else "")
    ops_said = (f"{U.intensity(v.total.intensity)} FLOP/byte against a ridge of {U.intensity(v.ridge)} "
                f"({phase.dtypes.act}, {device.source}); {U.percent(v.compute_time_share)} of its predicted "
                f"{U.seconds(v.time_s)} of ops is in compute-bound ops (time-weighted mix: {v.bound_by_mix}-bound)")
    if v.bound == COMMUNICATION:
        sentence = (f"{m.name} {what} on {where} is communication-bound: collectives take "
                    f"{U.percent(v.comm_share)} of its predicted {U.seconds(v.step_time_s)} per step "
                    f"({U.seconds(v.comm_time_s)} over {v.link.name}); its ops alone would be "
                    f"{v.bound_by_sum}-bound: {ops_said}.")
    else:
        sentence = f"{m.name} {what} on {where} is {v.bound}-bound: {ops_said}."
        if v.collectives:
            sentence += (f" Collectives add {U.seconds(v.comm_time_s)} over {v.link.name} "
                         f"({U.percent(v.comm_share)} of the {U.seconds(v.step_time_s)} step).")
    d = {"phase": phase.phase, "device": device.name, "device_source": device.source, "model": m.name,
         "batch": phase.batch, "context": phase.context, "cached": phase.cached_tokens,
         "chunks": list(phase.chunks),
         "dtypes": {"weight": phase.dtypes.weight, "act": phase.dtypes.act, "kv": phase.dtypes.kv},
         "ridge": v.ridge, "ops": ops, "total": total, "verdict": sentence, "tp": tp, "ep": ep, "bound": v.bound}
    if v.collectives:
        lk = v.link
        d["collectives"] = [{"name": c.name, "kind": c.kind, "count": c.count, "shape": c.shape,
                             "message_bytes": c.message_bytes, "wire_bytes": c.wire_bytes, "latency_s": c.latency_s,
                             "time_s": c.time_s} for c in v.collectives]
        by_kind = {}
        for c in v.collectives:   # each kind's time per step and its share of the step
            k = by_kind.setdefault(c.kind, {"time_s": 0.0, "wire_bytes": 0.0, "share": 0.0})
            k["time_s"] += c.total_time_s
            k["wire_bytes"] += c.wire_bytes * c.count
        for k in by_kind.values():
            k["share"] = k["time_s"] / v.step_time_s if v.step_time_s else 0.0
        d["communication"] = {"time_s": v.comm_time_s, "share": v.comm_share, "step_time_s": v.step_time_s,
                              "wire_bytes": phase.collective_wire_bytes, "by_kind": by_kind,
                              "link": {"name": lk.name, "bandwidth": lk.bandwidth, "base_latency": lk.base_latency,
                                       "hop_latency": lk.hop_latency, "source": lk.source,
                                       "provenance": lk.provenance}}
    return d


def phase_table_text(d: dict) -> str:
    """Plain-text table of ``explain_phase``'s dict (one instance per row; count beside)."""
    w = max([14] + [len(o["name"]) + 1 for o in d["ops"]])      # the op column fits the longest name
    hdr = f"{'op':<{w}}{'count':>6}{'FLOPs':>14}{'bytes':>13}{'FLOP/B':>10}  {'bound':<8}{'time':>11}"
    rows = [hdr, "-" * len(hdr)]
    for o in d["ops"]:
        rows.append(f"{o['name']:<{w}}{o['count']:>6}{U.flops(o['flops']):>14}{U.nbytes(o['bytes']):>13}"
                    f"{U.intensity(o['intensity']):>10}  {o['bound']:<8}{U.seconds(o['time_s']):>11}")
    t = d["total"]
    rows.append("-" * len(hdr))
    rows.append(f"{'step total':<{w}}{'':>6}{U.flops(t['flops']):>14}{U.nbytes(t['bytes']):>13}"
                f"{U.intensity(t['intensity']):>10}  {t['bound']:<8}{U.seconds(t['time_s']):>11}")
    rows.append("(FLOPs, bytes and time are for one instance; the total counts every instance.)")
    return "\n".join(rows)


def collectives_table_text(d: dict) -> str:
    """Plain-text table of ``explain_phase``'s collectives (one instance per row; count beside), or ""."""
    if not d.get("collectives"):
        return ""
    c = d["communication"]
    lk = c["link"]
    hdr = f"{'collective':<20}{'count':>6}  {'message':<28}{'on the wire':>12}{'latency':>10}{'time':>11}"
    a2a = any(o["kind"] == "all_to_all" for o in d["collectives"])
    rows = [f"collectives per step, per rank, over {lk['name']}: {U.bandwidth(lk['bandwidth'])} per direction "
            f"({lk['source']}); ring volume 2(N-1)/N per all-reduce, (N-1)/N per all-gather"
            + (", (N-1)/N per all-to-all (nccl-tests' alltoall: busbw = algbw x (N-1)/N; the message is a rank's "
               "T*k/N routed rows)" if a2a else ""), hdr, "-" * len(hdr)]
    for o in d["collectives"]:
        msg = f"{o['shape']} {U.nbytes(o['message_bytes'])}"
        rows.append(f"{o['name']:<20}{o['count']:>6}  {msg:<28}{U.nbytes(o['wire_bytes']):>12}"
                    f"{U.seconds(o['latency_s']):>10}{U.seconds(o['time_s']):>11}")
    rows.append("-" * len(hdr))
    rows.append(f"{'collectives total':<20}{'':>6}  {'':<28}{U.nbytes(c['wire_bytes']):>12}{'':>10}"
                f"{U.seconds(c['time_s']):>11}")
    rows.append(f"communication share: {U.percent(c['share'])} of the predicted {U.seconds(c['step_time_s'])} step "
                f"({U.seconds(c['step_time_s'] - c['time_s'])} of ops + {U.seconds(c['time_s'])} of collectives, "
                "no overlap).")
    kinds = c.get("by_kind", {})
    if "all_to_all" in kinds and len(kinds) > 1:
        rows.append("by kind: " + "; ".join(f"{k.replace('_', '-')}s {U.seconds(x['time_s'])} "
                                            f"({U.percent(x['share'])} of the step)" for k, x in kinds.items()) + ".")
    return "\n".join(rows)


FULL_SHARE = 0.99   # "every expert loaded": a step touches at least this share of the experts, in expectation


def expert_curve(phase_at, model, batches=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512)) -> dict:
    """Reuse fragmentation of a mixture of experts at decode: per batch, the distinct experts a step touches per
    MoE layer and the expert weight bytes it reads (``phase_at(batch)`` -> a decode ``Phase``), the dense
    equivalent (the same active parameters read once), and the smallest batch from which every expert is loaded
    (at least ``FULL_SHARE`` of them in expectation). {} for a dense model."""
    if not model.n_experts:
        return {}
    rows = []
    for b in batches:
        ph = phase_at(b)
        rows.append({"batch": b, "experts_touched": ph.experts_touched, "expert_bytes": ph.expert_weight_bytes,
                     "weight_bytes": ph.weight_bytes, "step_bytes": ph.total.bytes})
    one = rows[0]["expert_bytes"] / max(rows[0]["experts_touched"], 1e-12)   # per expert, over the MoE layers
    load = ph.dtypes.expert_load   # a measured histogram, or () for uniform routing
    full = next((b for b in range(1, 1 << 16) if phase_at_share(model, b, load) >= FULL_SHARE), None)
    ep = getattr(ph, "ep", 1)     # expert parallel: a rank reads only its own E / ep experts
    held = model.n_experts // ep
    return {"n_experts": model.n_experts, "k": model.n_active, "rows": rows, "per_expert_bytes": one,
            "all_experts_bytes": one * held, "full_batch": full, "ep": ep, "rank_experts": held,
            "routing": "measured expert load" if load else "uniform routing"}


def phase_at_share(model, batch: int, load=()) -> float:
    """The share of a layer's experts a decode step of ``batch`` tokens touches, in expectation (uniform routing,
    or ``load``: each expert's share of the routed slots)."""
    return F.expected_distinct_experts(model.n_experts, model.n_active, batch,
                                       skew=list(load) if load else None) / model.n_experts


def expert_curve_text(c: dict) -> str:
    if not c:
        return ""
    ep = c.get("ep", 1)
    lines = [f"Expert weights against batch (decode, {c.get('routing', 'uniform routing')}: {c['k']} of "
             f"{c['n_experts']} experts per "
             "token; a step reads each distinct expert once"
             + (f"; per rank: its {c['rank_experts']} of the {c['n_experts']} experts, over {ep} expert-parallel ranks):" if ep > 1
                else "):"),
             f"{'batch':>7} {'experts/layer':>14} {'expert bytes':>13} {'all weights':>12}"]
    for r in c["rows"]:
        lines.append(f"{r['batch']:>7} {r['experts_touched']:>14.2f} {U.nbytes(r['expert_bytes']):>13} "
                     f"{U.nbytes(r['weight_bytes']):>12}")
    if c["full_batch"]:
        lines.append(f"Every expert is loaded (>= {FULL_SHARE:.0%} of them per layer) from batch {c['full_batch']}: "
                     f"{U.nbytes(c['all_experts_bytes'])} of expert weights per step. Below it, an extra token in the batch "
                     "mostly brings new experts' weights (reuse fragmentation: decode stays bound by expert bytes); "
                     "from it on, extra tokens reuse weights already read, as in a dense model.")
    return "\n".join(lines)


# ---------------------------------------------------------------- `roofline explain` of a model step

@dataclass(frozen=True)
class ExplainSpec:
    """One ``roofline explain`` of a model step, built once from the options: the model and the device (with the
    link its collectives cross: None = the device's), the step (phase, batch, context; a prefill's cached prefix
    and chunk), the precision it runs at and its parallelism."""

    model: ModelConfig
    device: Device
    phase: str = "decode"             # "prefill" | "decode"
    batch: int = 1
    context: int = 1024               # prefill: prompt length; decode: tokens already in the KV cache
    cached: int = 0                   # prefill: cached prefix tokens reused
    chunk: int | None = None          # prefill: chunk size in tokens (chunked prefill)
    weight_dtype: str | None = None   # a format for every linear, or module=format,...; None: the checkpoint's
    act_dtype: str = "bf16"
    kv_dtype: str | None = None       # None: the checkpoint's KV scheme, else bf16
    tp: int = 1
    ep: int = 1
    group_size: int | None = None     # int4 weights: input rows per scale
    zero_point: bool = False          # int4 weights: zero points
    expert_load: tuple = ()           # MoE: tokens per expert (a measured histogram); () = uniform routing
    link: object = None               # roofline.interconnect.Interconnect, or None: the device's
    mix: tuple | None = None          # a mixed step: (prefill chunks (new, cached), decode groups (n, keys))

    def __post_init__(self):
        if self.phase not in ("prefill", "decode"):
            raise RooflineError(f"phase must be prefill or decode, not {self.phase!r}.")
        if self.phase == "decode" and (self.cached or self.chunk):
            raise RooflineError("--cached and --chunk apply to --phase prefill only.")

    @property
    def checkpoint(self) -> Precision:
        """The model's own precision (its quantization_config; empty for a float model)."""
        return precision_of(self.model)

    @property
    def precision(self) -> Precision:
        """Each module's formats: the checkpoint's with ``--weight-dtype`` / ``--kv-dtype`` over them; a float
        model without a flag is costed in bf16 weights (the float checkpoint's), as before; without a KV scheme
        the cache is bf16 (``_step_options``)."""
        base = self.checkpoint
        weight = self.weight_dtype or (None if base.source else "bf16")
        return base.with_flags(weight, self.kv_dtype, group_size=self.group_size, zero_point=self.zero_point)

    @property
    def per_module(self) -> bool:
        """Whether the modules may differ (a quantized checkpoint, or ``--weight-dtype module=format``): then
        ``explain`` says each one's precision on top and beside the weight bytes."""
        return bool(self.checkpoint.source) or "=" in (self.weight_dtype or "")

    @property
    def weight_label(self) -> str:
        return self.weight_dtype or ("checkpoint" if self.checkpoint.source else "bf16")

    @property
    def said(self) -> str:
        """Each module's precision in one line (``Precision.describe``)."""
        return self.precision.describe(module_classes(self.model), self.act_dtype)

    def _step_options(self) -> dict:
        kw = dict(weight_dtype=self.weight_label, act_dtype=self.act_dtype, kv_dtype=self.kv_dtype or "bf16",
                  tp=self.tp, ep=self.ep, group_size=self.group_size, zero_point=self.zero_point,
                  precision=self.precision)
        if self.expert_load:
            kw["expert_load"] = list(self.expert_load)
        return kw

    def step(self) -> W.Phase:
        """The step explained, as ``roofline.workload`` costs it (a mix: ``workload.mixed``)."""
        if self.mix is not None:
            return W.mixed(self.model, *self.mix, **self._step_options())
        if self.phase == "prefill":
            return W.prefill(self.model, self.batch, self.context, cached_tokens=self.cached, chunk=self.chunk,
                             **self._step_options())
        return W.decode(self.model, self.batch, self.context, **self._step_options())

    def decode_at(self, batch: int) -> W.Phase:
        """A decode step of ``batch`` sequences at this context and precision (the expert curve's points)."""
        return W.decode(self.model, batch, self.context, **self._step_options())


@dataclass(frozen=True)
class StepExplained:
    """``explain_step``'s answer: the step, its fit in memory, and ``data`` (what ``--json`` prints)."""

    spec: ExplainSpec
    phase: W.Phase
    capacity: Capacity
    data: dict

    def text(self) -> str:
        """What ``roofline explain`` prints: the fit, the settings, the per-op table (and the collectives'), the
        bytes a decode step reads, the verdict and, for a mixture of experts, the expert curve."""
        s, ph, cap, d = self.spec, self.phase, self.capacity, self.data
        tp, ep = ph.tp, ph.ep          # --ep N alone: N ranks (roofline.parallel.ranks)
        mixed = s.per_module
        lines = ([d["precision"]["line"]] if mixed else []) + [
                 ("DOES NOT FIT: " if not cap.fits else "capacity: ") + cap.sentence,
                 f"{d['model']} {d['phase']} on {d['device']} ({s.device.source} ceilings), "
                 + ("weights per module as above" if mixed else f"weights {s.weight_dtype or 'bf16'}")
                 + (f" (group {ph.dtypes.group_size}{', zero points' if s.zero_point else ''})"
                    if s.weight_dtype == "int4" else "")
                 + f", activations {s.act_dtype}, {ph.dtypes.precision.describe_kv(s.act_dtype)}"
                 + (f"; expert parallel over {ep} ranks ({s.model.n_experts // ep} whole expert(s) each, attention "
                    "tensor parallel over the same ranks): every row is one rank's share" if ep > 1 else
                    f"; tensor parallel over {tp} ranks: every row is one rank's share" if tp > 1 else ""),
                 phase_table_text(d)]
        if tp > 1:
            lines.append(collectives_table_text(d))
        if ph.phase == "decode":
            lines.append(f"KV cache read: {U.nbytes(ph.kv_cache_read_bytes)} ({ph.kv_cache_read_bytes:,.0f} bytes); "
                         f"weights read: {U.nbytes(ph.weight_bytes)}" + (" (per rank)" if tp > 1 else "")
                         + ("; scales counted (roofline.precision.weight_bytes, formulas.kv_scale_bytes)."
                            if _any_scales(ph) else "."))
        if d.get("layer_kinds"):
            lines.append(layer_kinds_text(d["layer_kinds"]))
        lines.append(d["verdict"])
        if d.get("experts"):
            lines.append(expert_curve_text(d["experts"]))
        return "\n".join(lines)


def layer_kinds(ph) -> dict:
    """A hybrid's (Gated DeltaNet or Mamba-2 beside attention) split of what the step reads from its caches, per
    kind of layer: the attention layers' KV (growing with the context) and each stateful kind's state
    (constant); under DeepSeek Sparse Attention, the latent KV of the selected tokens beside the indexer's keys of
    the whole context; {} for a model whose every layer attends densely."""
    m = ph.model
    cached = ph.context if ph.phase == "decode" else ph.cached_tokens
    if m.index_topk:
        return {"context": cached, "mla_layers": m.n_layers, "kv_read_bytes": ph.kv_cache_read_bytes,
                "selected_tokens": ph.selected_tokens, "index_layers": len(m.index_layers),
                "index_read_bytes": ph.index_read_bytes, "index_key_bytes": F.index_key_bytes(m.index_head_dim)}
    states = ph.state_read_by_kind
    if not states:
        return {}
    return {"context": cached, "attention_layers": len(m.attention_layers), "kv_read_bytes": ph.kv_cache_read_bytes,
            "states": [{"kind": k, "layers": n, "state_read_bytes": b} for k, n, b in states]}


def layer_kinds_text(k: dict) -> str:
    """``layer_kinds`` in one line: "at context 131,072: 12 attention layers read 3.2 GB of KV, 36 DeltaNet
    layers read 75 MB of state"; under DeepSeek Sparse Attention, "61 MLA layers read 144 MB of KV for 2,048
    selected tokens; the indexer (61 layers) reads 1.06 GB of keys over 131,072"."""
    if "index_layers" in k:
        return (f"at context {k['context']:,}: {k['mla_layers']} MLA layers read {U.nbytes(k['kv_read_bytes'])} of KV "
                f"for {k['selected_tokens']:,} selected tokens; the indexer ({k['index_layers']} layers) reads "
                f"{U.nbytes(k['index_read_bytes'])} of keys over {k['context']:,} (fp8 + an fp32 scale per 128: "
                f"{k['index_key_bytes']:,} bytes per token and layer).")
    states = ", ".join(f"{s['layers']} {s['kind']} layers read {U.nbytes(s['state_read_bytes'])} of state"
                       for s in k["states"])
    return (f"at context {k['context']:,}: {k['attention_layers']} attention layers read {U.nbytes(k['kv_read_bytes'])}"
            f" of KV, {states} (fp32 recurrent state + conv state, constant in the context).")


def _any_scales(ph) -> bool:
    """Whether the step reads a quantized weight or an 8-bit KV cache (their scales counted)."""
    p = ph.dtypes.precision
    return any(f.quantized for _, f in p.weights) or any(f is not None and f.quantized for _, _, f in p.ops) \
        or ph.dtypes.kv in F.QUANTIZED_KV


def explain_step(spec: ExplainSpec) -> StepExplained:
    """``roofline explain`` of a model step: ``explain_phase``'s table and verdict on ``spec.device`` (over
    ``spec.link``), the step's fit in the device's memory ("capacity") and, for a mixture of experts, the expert
    weights a decode step reads against the batch ("experts", ``expert_curve``)."""
    ph = spec.step()
    d = explain_phase(ph, spec.device, spec.link)
    dt = ph.dtypes
    cap = capacity(spec.model, spec.device, ph.batch if spec.mix else spec.batch,
                   ph.context if spec.mix else spec.context, tp=ph.tp, ep=ph.ep,
                   new_tokens=ph.new_tokens if ph.phase == "prefill" else 1, act_dtype=dt.act, kv_dtype=dt.kv,
                   precision=dt.precision,
                   weights_said=spec.said.partition(": ")[2] if spec.per_module else "")
    d["capacity"] = cap.to_dict()
    d["layer_kinds"] = layer_kinds(ph)
    d["precision"] = {**dt.precision.to_dict(dt.act), "line": spec.said,
                      "weight_bytes_by_module": weight_bytes_by_module(spec.model, dt.precision, dt.act, ph.tp, ph.ep)}
    curve = expert_curve(spec.decode_at, spec.model) if spec.model.n_experts else {}
    if curve:
        d["experts"] = curve
    return StepExplained(spec, ph, cap, d)


# ---------------------------------------------------------------- `roofline explain --spec`: speculative decoding

SPEC_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)   # the curve's batches unless --batch lists others
SPEC_SEARCH = 1 << 16    # the ridge and break-even batches are searched up to 65,536 sequences


def spec_round_at(spec: ExplainSpec, sp: S.Speculation):
    """batch -> ``roofline.speculative.speculation_round`` of ``sp`` at ``spec``'s context and precision (a draft
    model in its own options, the MTP layer in the target's)."""
    draft_opts = None
    if sp.draft == "model":
        ds = ExplainSpec(model=sp.draft_model, device=spec.device, context=spec.context, act_dtype=spec.act_dtype)
        draft_opts = ds._step_options()
    elif sp.draft == "mtp":
        draft_opts = replace(spec, model=S.mtp_layer(spec.model))._step_options()
    opts = spec._step_options()
    return lambda b: S.speculation_round(sp, spec.model, spec.device, b, spec.context, opts, draft_opts, spec.link)


def spec_curve(spec: ExplainSpec, sp: S.Speculation, batches=SPEC_BATCHES) -> dict:
    """Plain decode against speculation ``sp`` across ``batches`` at ``spec``'s context and precision
    (``roofline.speculative.speculation_round`` per batch: tokens/s per user and per device, the speedup), the
    batch from which the verify step is compute-bound (its summed intensity at the ridge: ``explain``'s verdict;
    and the batch from which most of its predicted time is in compute-bound ops), the batch from which
    speculation stops paying (speedup < 1), both searched up to ``SPEC_SEARCH`` by doubling and bisection (the
    verify step's intensity grows with batch and the speedup falls with it), and the largest batch whose verify
    step fits in memory. One device only: --tp / --ep are refused."""
    if spec.tp > 1 or spec.ep > 1 or spec.mix is not None or spec.phase != "decode":
        raise RooflineError("--spec prices decode rounds on one device: drop --tp, --ep, --mix, --phase prefill, "
                            "--cached and --chunk (tensor parallelism with speculation is not modelled yet).")
    batches = [check_positive_int("batch", b) for b in batches]
    m, dev, ctx = spec.model, spec.device, spec.context
    opts = spec._step_options()
    at = spec_round_at(spec, sp)

    def verify(b):
        return S.verify_step(m, b, ctx, sp.k, **opts)

    rows = [at(b) for b in batches]
    ridge = dev.ridge(opts["act_dtype"])
    by_sum = crossing(lambda b: verify(b).total.intensity, ridge, limit=SPEC_SEARCH)
    by_mix = crossing(lambda b: float(analyze_phase(verify(b), dev, spec.link).compute_time_share >= 0.5), 1.0,
                      limit=SPEC_SEARCH)
    stops = crossing(lambda b: float(at(b).speedup < 1), 1.0, limit=SPEC_SEARCH)
    ph = verify(1)
    cap = capacity(m, dev, 1, ctx + sp.k + 1, new_tokens=sp.k + 1, act_dtype=ph.dtypes.act, kv_dtype=ph.dtypes.kv,
                   precision=ph.dtypes.precision)
    return {"model": m.name, "device": dev.name, "device_source": dev.source, "context": ctx, "k": sp.k,
            "acceptance": sp.acceptance, "tokens_per_step": sp.tokens_per_step, "draft": sp.draft,
            "draft_model": sp.draft_model.name if sp.draft_model else None, "draft_said": sp.said,
            "vocab": m.vocab, "act_dtype": ph.dtypes.act, "weights": spec.weight_label, "ridge": ridge,
            "rows": [r.to_dict() for r in rows], "verify_ridge_batch": by_sum, "verify_compute_time_batch": by_mix,
            "stops_paying_batch": stops, "search_limit": SPEC_SEARCH, "max_batch": cap.max_batch,
            "notes": list(S.verify_notes(m))}


def spec_curve_text(d: dict) -> str:
    """What ``roofline explain --spec`` prints: the settings, the curve, the ridge and break-even batches."""
    k, n = d["k"], d["search_limit"]
    lines = [f"Speculative decoding: {d['model']} on {d['device']} ({d['device_source']} ceilings), weights "
             f"{d['weights']}, activations {d['act_dtype']}, context {d['context']:,}; k = {k} drafts per verify "
             f"step, each accepted with probability {d['acceptance']:g} (independently): (1 - a^{k + 1}) / (1 - a) "
             f"= {d['tokens_per_step']:.4g} tokens per verify step; draft: {d['draft_said']}.",
             f"A round: the draft's steps, one verify step ({k + 1} query tokens per sequence over its context: "
             f"linears on {k + 1} x batch rows, attention causal among the {k + 1}, logits at each), rejection "
             f"sampling over the {d['vocab']:,}-token vocabulary; each step at its roof (max(FLOPs / peak, bytes / "
             "bandwidth) per op, summed).",
             f"{'batch':>6} {'decode':>10} {'round':>10} {'(draft':>9} {'verify':>10} {'reject)':>9} "
             f"{'tok/s/user':>17} {'tok/s/device':>21} {'speedup':>8} {'verify FLOP/B':>14}",
             f"{'':>6} {'step':>10} {'':>10} {'':>9} {'':>10} {'':>9} {'plain -> spec':>17} {'plain -> spec':>21}"]
    for r in d["rows"]:
        lines.append(
            f"{r['batch']:>6} {U.seconds(r['decode_s']):>10} {U.seconds(r['round_s']):>10} "
            f"{U.seconds(r['draft_s']) if d['draft'] != 'none' else '-':>9} {U.seconds(r['verify_s']):>10} "
            f"{U.seconds(r['reject_s']):>9} "
            f"{r['plain_tokens_per_s_user']:>7,.0f} -> {r['spec_tokens_per_s_user']:>6,.0f} "
            f"{r['plain_tokens_per_s_device']:>9,.0f} -> {r['spec_tokens_per_s_device']:>8,.0f} "
            f"{r['speedup']:>7.2f}x {U.intensity(r['verify_intensity']):>8} {r['verify_bound']}"
            + (" (does not fit)" if d["max_batch"] and r["batch"] > d["max_batch"] else ""))
    ridge = U.intensity(d["ridge"])
    s, t = d["verify_ridge_batch"], d["verify_compute_time_batch"]
    lines.append((f"The verify step turns compute-bound at batch {s:,}: its summed intensity reaches the ridge of "
                  f"{ridge} FLOP/byte there" if s else
                  f"The verify step's summed intensity stays under the ridge of {ridge} FLOP/byte up to batch {n:,}")
                 + (f"; most of its predicted time is in compute-bound ops (its linears on {k + 1} x batch rows) from "
                    f"batch {t:,}." if t else f"; most of its time stays in memory-bound ops up to batch {n:,}."))
    stop, fit = d["stops_paying_batch"], d["max_batch"]
    beyond = f", beyond the {fit:,} that fit in memory" if fit and stop and stop > fit else ""
    lines.append(f"Speculation never pays here: a round costs more than {d['tokens_per_step']:.4g} decode steps "
                 "even at batch 1." if stop == 1 else
                 f"Speculation stops paying at batch {stop:,}{beyond}: from there a round costs more than "
                 f"{d['tokens_per_step']:.4g} decode steps (speedup < 1)." if stop else
                 f"Speculation pays at every batch up to {n:,}" + (f" (of which {fit:,} fit in memory)" if fit else "")
                 + f": a round stays under {d['tokens_per_step']:.4g} decode steps (each sequence's KV cache is "
                 f"read once for its {k + 1} queries).")
    lines.append(f"Memory: a verify step fits up to batch {d['max_batch']:,} at this context (target weights and KV; "
                 "a draft model's not counted)." if d["max_batch"] else
                 f"Memory: not even batch 1 of the verify step fits on one {d['device']} (or its memory size is "
                 "unknown).")
    lines += [f"note: {n}" for n in d.get("notes", ())]
    return "\n".join(lines)
