"""The roofline floor under every latency (pure): the least time a stage can take on a device, by the cost model.

A stage's floor is the sum over its ops of each op's time at the roof, times its count per step::

    floor = sum over ops of max(FLOPs / peak, bytes / bandwidth) x count

with the ops and costs of ``roofline.workload`` (``prefill`` of the measured prompt, ``decode``
of one step at the measured batch and mean context) and each op's ceilings from
``roofline.bounds.roof_for`` (the one fallback rule: the op's compute dtype's peak, fp32 for
vector ops, else the run's dtype). No kernel can beat it; how far a measured latency sits above
it says whether the hardware is the limit:

* TTFT p50 against the floor of one prefill of the mean served prompt (its cached prefix
  reused), alone (batch 1): TTFT also holds the network, the server's queue and tokenization.
* TPOT p50 against the floor of one decode step at the measured concurrency (requests decoding
  at once, averaged over every output token) and the mean context of those steps.

``fraction`` = floor / measured: the share of the roof the stage reaches (12% of the bandwidth
roof = the step takes 8x the time its bytes need). The roof named is the one that holds most of
the floor's time (``memory_share``).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from . import workload
from .bounds import OVERHEAD_FRACTION, roof_for
from .errors import RooflineError
from .records import ABOVE_ROOF
from .units import ms, seconds


@dataclass(frozen=True)
class StageFloor:
    """The floor of one stage on one device, and how it splits between the two roofs."""

    stage: str             # "prefill" | "decode"
    seconds: float
    flops: float
    bytes: float
    batch: int
    tokens: int            # prefill: prompt tokens; decode: context (tokens already cached)
    cached: int
    memory_share: float    # share of the floor's time in ops whose bytes take longer than their FLOPs
    device: str
    notes: tuple = ()

    @property
    def roof(self) -> str:
        """'bandwidth' or 'compute': the roof that holds most of the floor's time."""
        return "bandwidth" if self.memory_share >= 0.5 else "compute"

    @property
    def shape(self) -> str:
        if self.stage == "prefill":
            cached = f" ({self.cached} cached)" if self.cached else ""
            return f"a {self.tokens}-token prefill{cached} at batch {self.batch}"
        return f"batch {self.batch} (context {self.tokens})"


def stage_floor(phase, device, dtype: str) -> StageFloor:
    """The floor of a ``workload.Phase`` on ``device`` (see the module docstring)."""
    total = memory = 0.0
    notes = set()
    for op in phase.ops:
        roof = roof_for(device, op.compute_dtype, dtype)
        if roof.note:
            notes.add(roof.note)
        t_flops = op.cost.flops / roof.peak if roof.peak else 0.0
        t_bytes = op.cost.bytes / roof.bandwidth
        t = max(t_flops, t_bytes) * op.count
        total += t
        if t_bytes >= t_flops:
            memory += t
    c = phase.total
    return StageFloor(phase.phase, total, c.flops, c.bytes, phase.batch,
                      phase.context, phase.cached_tokens, memory / total if total else 0.0, device.name,
                      tuple(sorted(notes)))


def prefill_floor(cfg, device, prompt: int, cached: int = 0, *, dtype: str = "bf16", batch: int = 1) -> StageFloor:
    """One prefill of ``prompt`` tokens (``cached`` of them reused), ``batch`` prompts at once."""
    return stage_floor(workload.prefill(cfg, batch, prompt, cached, weight_dtype=dtype, act_dtype=dtype,
                                        kv_dtype=dtype), device, dtype)


def decode_floor(cfg, device, batch: int, context: int, *, dtype: str = "bf16") -> StageFloor:
    """One decode step of ``batch`` sequences with ``context`` tokens cached each."""
    return stage_floor(workload.decode(cfg, batch, context, weight_dtype=dtype, act_dtype=dtype, kv_dtype=dtype),
                       device, dtype)


# ---------------------------------------------------------------- what a run served

@dataclass(frozen=True)
class ServedShape:
    """The sizes a latency run served, from its ok requests: what fixes the floors."""

    prompt: float          # mean served prompt tokens
    cached: float          # mean prompt tokens reused from a prefix cache
    batch: float           # requests decoding at once, averaged over every output token after the first
    context: float         # tokens cached at those decode steps, averaged the same way
    requests: int
    tokens: int            # output tokens after the first (the decode steps averaged over)


def served_shape(timelines) -> ServedShape | None:
    """From ``RequestTimeline``s: None when no ok request has a token.

    A request decodes from its first delivery to its last. The batch an output token k >= 1
    saw is the number of requests decoding at the middle of the gap before it; its decode
    step ran with the prompt and k - 1 output tokens cached.
    """
    ok = [t for t in timelines if t.ok and t.n >= 1]
    if not ok:
        return None
    starts = sorted(t.deliveries[0] for t in ok if t.n > 1)
    ends = sorted(t.deliveries[-1] for t in ok if t.n > 1)
    batch = ctx = 0.0
    n = 0
    for t in ok:
        d = t.deliveries
        for k in range(1, t.n):
            mid = (d[k - 1] + d[k]) / 2
            batch += bisect.bisect_right(starts, mid) - bisect.bisect_left(ends, mid)
            ctx += t.prompt_len + k - 1
            n += 1
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return ServedShape(prompt=mean([t.prompt_len for t in ok]), cached=mean([t.cached_tokens for t in ok]),
                       batch=batch / n if n else math.nan, context=ctx / n if n else math.nan, requests=len(ok),
                       tokens=n)


# ---------------------------------------------------------------- measured against the floor

@dataclass(frozen=True)
class FloorRatio:
    metric: str            # "TTFT" | "TPOT"
    measured: float        # seconds (p50)
    floor: StageFloor

    @property
    def ratio(self) -> float:
        return self.measured / self.floor.seconds if self.floor.seconds > 0 else math.inf

    @property
    def fraction(self) -> float:
        """floor / measured: the share of the roof this stage reaches."""
        return self.floor.seconds / self.measured if self.measured > 0 else math.nan

    @property
    def verdict(self) -> str:
        bound = "memory" if self.floor.roof == "bandwidth" else "compute"
        if self.fraction > ABOVE_ROOF:
            return ("faster than the floor allows: the model, dtype or device given is not what ran (or its ceilings "
                    "are too low)")
        if self.fraction < OVERHEAD_FRACTION:
            if self.metric == "TPOT":
                return f"the server is far from {bound}-bound; look at scheduling and per-step overhead"
            return (f"the server is far from {bound}-bound; look at queueing, scheduling and per-step overhead (TTFT "
                    "also holds the queue, tokenization and, from a client, the network)")
        return f"{bound}-bound within {self.ratio:.1f}x of the floor"

    @property
    def action(self) -> str:
        if self.fraction > ABOVE_ROOF:
            return "check --model, --dtype and --device against what the server runs"
        if self.fraction < OVERHEAD_FRACTION:
            if self.metric == "TPOT":
                return ("reduce the per-step overhead (CUDA graphs, fewer launches, a leaner scheduler step) or batch "
                        "more requests; more bandwidth or FLOP/s will not show")
            return ("shorten the queue (more capacity, a larger prefill budget), then the per-step overhead; a faster "
                    "device will not show")
        if self.floor.roof == "bandwidth":
            return "only fewer bytes (quantized weights or KV cache) or more memory bandwidth make this stage faster"
        return "only fewer FLOPs (a shorter prompt, prefix reuse) or more compute make this stage faster"

    @property
    def sentence(self) -> str:
        """'TPOT p50 35 ms against a roofline floor of 4.1 ms at batch 8 (context 1024): 12% of the bandwidth
        roof — the server is far from memory-bound; look at scheduling and per-step overhead'."""
        pct = f"{100 * self.fraction:.0f}%" if self.fraction >= 0.01 else f"{100 * self.fraction:.2g}%"
        at = f"for {self.floor.shape}" if self.floor.stage == "prefill" else f"at {self.floor.shape}"
        return (f"{self.metric} p50 {ms(self.measured)} against a roofline floor of {seconds(self.floor.seconds)} {at}: "
                f"{pct} of the {self.floor.roof} roof — {self.verdict}")

    def to_dict(self) -> dict:
        f = self.floor
        return {"metric": self.metric, "measured_s": self.measured, "floor_s": f.seconds, "ratio": self.ratio,
                "fraction": self.fraction, "roof": f.roof, "stage": f.stage, "batch": f.batch, "tokens": f.tokens,
                "cached": f.cached, "flops": f.flops, "bytes": f.bytes, "device": f.device}


def latency_floors(summary, timelines, cfg, device, dtype: str) -> list:
    """[FloorRatio] for TTFT p50 and TPOT p50 of one configuration (each where it is defined)."""
    shape = served_shape(timelines)
    if shape is None:
        return []
    out = []
    prompt = max(1, min(round(shape.prompt), cfg.max_context))
    cached = min(round(shape.cached), prompt - 1)
    ttft = summary.ttft.get("p50", math.nan)
    if not math.isnan(ttft):
        out.append(FloorRatio("TTFT", ttft, prefill_floor(cfg, device, prompt, cached, dtype=dtype)))
    tpot = summary.tpot.get("p50", math.nan)
    if not math.isnan(tpot) and shape.tokens:
        batch = max(1, round(shape.batch))
        context = max(1, min(round(shape.context), cfg.max_context - 1))
        out.append(FloorRatio("TPOT", tpot, decode_floor(cfg, device, batch, context, dtype=dtype)))
    return out


def check_floor_inputs(cfg, device) -> None:
    """RooflineError when no floor can be computed: no model config, or a device without ceilings."""
    if cfg is None:
        raise RooflineError("the floor needs the served model's shape: give --model (a preset or a config.json).")
    if not device.bandwidth > 0 or not device.peak_flops:
        raise RooflineError(f"{device.name} has no ceilings to put a floor under the latencies: give --device (a "
                            "catalogue name or --device-file) or --ceilings with a `roofline profile` result file.")
