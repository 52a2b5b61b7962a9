"""What the user sees: request timelines, TTFT / TPOT / ITL / E2E, goodput, SLOs (pure).

A ``RequestTimeline`` holds monotonic timestamps in seconds since the run started,
each taken after a device sync (``profiler.timing.timestamp``):

    arrival -> tokenize start/end -> queue start/end -> prefill chunk start/end (1+)
    -> first token selected -> first token delivered -> later tokens delivered -> finish

Metrics (names clash across tools, so the formulas travel with the numbers, ``FORMULAS``):

    TTFT   = first delivery - arrival
    TPOT   = (last delivery - first delivery) / (n - 1), per request; undefined for n = 1
    ITL    = each gap between consecutive deliveries (pooled over requests, and per request)
    E2E    = finish - arrival
    goodput = requests meeting every SLO given (TTFT, TPOT, E2E) / run duration

A failed request stays in the counts: it meets no SLO and is reported as failed.

The seed's worked example, as stage durations (``timeline_from_stages``):
queue 20 ms + prefill 80 ms + delivery 5 ms -> TTFT 105 ms; 3 x 25 ms gaps -> finish 180 ms.

>>> t = timeline_from_stages(queue=0.020, prefill=0.080, first_delivery=0.005, gaps=(0.025,) * 3)
>>> round(t.ttft * 1e3, 6), round(t.e2e * 1e3, 6), round(t.tpot * 1e3, 6)
(105.0, 180.0, 25.0)
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field

import numpy as np

from .errors import RooflineError

FORMULAS = (
    "TTFT = first token delivered - arrival",
    "TPOT = (last delivery - first delivery) / (n - 1) per request (undefined for n = 1)",
    "ITL = each gap between consecutive deliveries (pooled over requests, and per request)",
    "E2E = finish - arrival",
    "goodput = requests meeting every SLO / (last finish - first arrival)",
)
QUANTILES = (("p50", 0.50), ("p90", 0.90), ("p99", 0.99))
SLO_METRICS = ("ttft", "tpot", "e2e")


@dataclass(frozen=True)
class RequestTimeline:
    """One request's timestamps (seconds since the run's start) and sizes."""

    id: int
    arrival: float
    tokenize: tuple = (math.nan, math.nan)   # (start, end)
    queue: tuple = (math.nan, math.nan)      # (start, end): end = first scheduled
    chunks: tuple = ()                       # ((start, end, tokens), ...) prefill chunks
    first_selected: float = math.nan
    deliveries: tuple = ()                   # one per output token; [0] is the first token
    finish: float = math.nan
    prompt_tokens: int = 0
    cached_tokens: int = 0                   # prompt tokens reused from the prefix cache
    output_tokens: int = 0                   # requested
    status: str = "ok"                       # "ok" | "failed"
    error: str = ""
    config: str = ""                         # the configuration this ran under
    block_hashes: tuple = ()                 # chained hashes of the prompt's full blocks

    # ---- derived ----
    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def n(self) -> int:
        return len(self.deliveries)

    @property
    def ttft(self) -> float:
        return self.deliveries[0] - self.arrival if self.deliveries else math.nan

    @property
    def tpot(self) -> float:
        """Mean gap after the first token; NaN (undefined) when fewer than two tokens."""
        if self.n < 2:
            return math.nan
        return (self.deliveries[-1] - self.deliveries[0]) / (self.n - 1)

    @property
    def itls(self) -> list:
        d = self.deliveries
        return [b - a for a, b in zip(d, d[1:])]

    @property
    def e2e(self) -> float:
        return self.finish - self.arrival

    @property
    def prefilled_tokens(self) -> int:
        return int(sum(c[2] for c in self.chunks))

    @property
    def stages(self) -> dict:
        """TTFT and E2E split into stages (seconds); they add up to E2E.

        queue: arrival -> first chunk starts (tokenization and waiting included);
        prefill: first chunk start -> first token selected (interleaved work of others included);
        delivery: selected -> delivered; decode: first delivery -> finish.
        """
        if not self.chunks or not self.deliveries:
            return {}
        start = self.chunks[0][0]
        return {"queue": start - self.arrival, "prefill": self.first_selected - start,
                "delivery": self.deliveries[0] - self.first_selected, "decode": self.finish - self.deliveries[0]}

    def to_dict(self) -> dict:
        d = asdict(self)
        d["chunks"] = [list(c) for c in self.chunks]
        d["tokenize"], d["queue"] = list(self.tokenize), list(self.queue)
        d["deliveries"], d["block_hashes"] = list(self.deliveries), list(self.block_hashes)
        return {"type": "request", **d}

    @classmethod
    def from_dict(cls, d: dict) -> "RequestTimeline":
        d = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        for k in ("tokenize", "queue", "deliveries", "block_hashes"):
            if k in d:
                d[k] = tuple(d[k])
        d["chunks"] = tuple(tuple(c) for c in d.get("chunks", ()))
        return cls(**d)


def timeline_from_stages(queue: float, prefill: float, first_delivery: float, gaps=(), *, tokenize: float = 0.0,
                         arrival: float = 0.0, prompt_tokens: int = 0, id: int = 0) -> RequestTimeline:
    """A timeline from stage durations (seconds) with no overlap, as in the seed's table."""
    t = arrival
    tok = (t, t + tokenize)
    t += tokenize
    q = (t, arrival + queue)
    t = arrival + queue
    chunks = ((t, t + prefill, prompt_tokens),)
    selected = t + prefill
    deliveries = [selected + first_delivery]
    for g in gaps:
        deliveries.append(deliveries[-1] + g)
    return RequestTimeline(id=id, arrival=arrival, tokenize=tok, queue=q, chunks=chunks, first_selected=selected,
                           deliveries=tuple(deliveries), finish=deliveries[-1], prompt_tokens=prompt_tokens,
                           output_tokens=len(deliveries))


def stats(xs) -> dict:
    """p50, p90, p99 (linear interpolation, numpy's default), mean and max; NaN when empty."""
    a = np.asarray([x for x in xs if not math.isnan(x)], dtype=float)
    if a.size == 0:
        return {"n": 0, **{k: math.nan for k, _ in QUANTILES}, "mean": math.nan, "max": math.nan}
    out = {"n": int(a.size)}
    out.update({k: float(np.quantile(a, q)) for k, q in QUANTILES})
    out["mean"] = float(a.mean())
    out["max"] = float(a.max())
    return out


_UNITS = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}
_SLO_RE = re.compile(r"^\s*([a-z0-9]+)\s*=\s*([0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)\s*(us|µs|ms|s)\s*$", re.I)


def parse_slo(text: str | None) -> dict:
    """'ttft=200ms,tpot=50ms,e2e=2s' -> {'ttft': 0.2, 'tpot': 0.05, 'e2e': 2.0} (seconds)."""
    if text is None or not str(text).strip():
        return {}
    out = {}
    for part in str(text).split(","):
        m = _SLO_RE.match(part)
        if not m:
            raise RooflineError(f"SLO {part.strip()!r} is malformed: write NAME=NUMBER+UNIT with NAME one of "
                                f"{', '.join(SLO_METRICS)} and UNIT one of us, ms, s, e.g. ttft=200ms,tpot=50ms,e2e=2s.")
        name, value, unit = m.group(1).lower(), float(m.group(2)), m.group(3).lower()
        if name not in SLO_METRICS:
            raise RooflineError(f"SLO metric {name!r} is unknown; use {', '.join(SLO_METRICS)}.")
        if name in out:
            raise RooflineError(f"SLO metric {name!r} is given twice.")
        if value <= 0:
            raise RooflineError(f"SLO {name} must be above zero, but {part.strip()!r} was given.")
        out[name] = value * _UNITS[unit]
    return out


def format_slo(slo: dict) -> str:
    return ",".join(f"{k}={v * 1e3:g}ms" for k, v in slo.items()) or "none"


def meets_slo(t: RequestTimeline, slo: dict) -> bool:
    """Every given target met. A failed request meets none; undefined TPOT (n = 1) passes TPOT."""
    if not t.ok:
        return False
    for name, limit in slo.items():
        v = getattr(t, name)
        if name == "tpot" and math.isnan(v):
            continue
        if math.isnan(v) or v > limit:
            return False
    return True


@dataclass(frozen=True)
class LatencySummary:
    """Per-configuration summary: the derived numbers of a list of timelines."""

    config: str
    settings: dict = field(default_factory=dict)
    requests: int = 0
    failed: int = 0
    tpot_undefined: int = 0     # ok requests with one output token
    duration_s: float = math.nan
    ttft: dict = field(default_factory=dict)
    tpot: dict = field(default_factory=dict)
    itl: dict = field(default_factory=dict)          # pooled over every gap of every ok request
    itl_by_request: dict = field(default_factory=dict)  # request id -> stats of its own gaps
    e2e: dict = field(default_factory=dict)
    stages: dict = field(default_factory=dict)  # mean seconds per stage over ok requests
    slo: dict = field(default_factory=dict)
    met_slo: int = 0
    goodput_rps: float = math.nan
    throughput_rps: float = math.nan
    output_tok_per_s: float = math.nan
    prefilled_tokens: int = 0
    cached_tokens: int = 0
    formulas: tuple = FORMULAS

    def to_dict(self) -> dict:
        d = asdict(self)
        d["formulas"] = list(self.formulas)
        return {"type": "latency-summary", **d}

    @classmethod
    def from_dict(cls, d: dict) -> "LatencySummary":
        d = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        d["formulas"] = tuple(d.get("formulas", FORMULAS))
        return cls(**d)


def summarize(timelines, slo: dict | None = None, config: str = "", settings: dict | None = None) -> LatencySummary:
    """Metrics over ``timelines``; failed requests are counted, never dropped."""
    ts = list(timelines)
    slo = dict(slo or {})
    ok = [t for t in ts if t.ok]
    if ts:
        ends = [t.finish for t in ts if not math.isnan(t.finish)]
        duration = (max(ends) if ends else math.nan) - min(t.arrival for t in ts)
    else:
        duration = math.nan
    met = sum(meets_slo(t, slo) for t in ts)
    rate = lambda k: k / duration if duration and duration > 0 else math.nan  # noqa: E731
    stage_names = ("queue", "prefill", "delivery", "decode")
    staged = [t.stages for t in ok if t.stages]
    stages = {s: float(np.mean([st[s] for st in staged])) if staged else math.nan for s in stage_names}
    return LatencySummary(
        config=config, settings=dict(settings or {}), requests=len(ts), failed=len(ts) - len(ok),
        tpot_undefined=sum(1 for t in ok if t.n < 2), duration_s=duration,
        ttft=stats(t.ttft for t in ok), tpot=stats(t.tpot for t in ok),
        itl=stats(g for t in ok for g in t.itls),
        itl_by_request={str(t.id): stats(t.itls) for t in ok if t.n > 1}, e2e=stats(t.e2e for t in ok), stages=stages,
        slo=slo, met_slo=met, goodput_rps=rate(met), throughput_rps=rate(len(ok)),
        output_tok_per_s=rate(sum(t.n for t in ok)),
        prefilled_tokens=sum(t.prefilled_tokens for t in ts), cached_tokens=sum(t.cached_tokens for t in ts))


def arrival_times(n: int, rate: float, process: str = "poisson", seed: int = 0) -> list:
    """Scheduled arrival offsets (seconds): fixed = i / rate; poisson = cumulative Exp(rate) gaps, seeded.

    The first request arrives at 0 in both cases.
    """
    if not (rate > 0) or math.isinf(rate):
        raise RooflineError(f"the arrival rate must be a positive number of requests per second, not {rate!r}.")
    if process == "fixed":
        return [i / rate for i in range(n)]
    if process == "poisson":
        gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=max(n - 1, 0))
        return [0.0] + [float(x) for x in np.cumsum(gaps)]
    raise RooflineError(f"arrival process must be 'fixed' or 'poisson', not {process!r}.")


def ms(x: float) -> str:
    """Seconds -> '105.0 ms' (or 'undefined' for NaN)."""
    if x is None or math.isnan(x):
        return "undefined"
    return f"{x * 1e3:.3f} ms" if 0 < abs(x) < 1e-3 else f"{x * 1e3:.1f} ms"


def summary_lines(s: LatencySummary) -> list:
    """A plain-text table of one summary, formulas included once by the caller."""
    head = f"{'metric':<6}{'p50':>12}{'p90':>12}{'p99':>12}{'mean':>12}{'n':>6}"
    rows = [head]
    for name in ("ttft", "tpot", "itl", "e2e"):
        st = getattr(s, name)
        rows.append(f"{name.upper():<6}" + "".join(f"{ms(st.get(k, math.nan)):>12}" for k in ("p50", "p90", "p99", "mean"))
                    + f"{st.get('n', 0):>6}")
    und = f"; TPOT undefined (n = 1) for {s.tpot_undefined}" if s.tpot_undefined else ""
    worst = max(s.itl_by_request.items(), key=lambda kv: kv[1].get("max", -1), default=None)
    if worst:
        w = worst[1]
        rows.append(f"ITL per request: worst is request {worst[0]} (mean {ms(w['mean'])}, max {ms(w['max'])}); "
                    f"per-request means range {ms(min(v['mean'] for v in s.itl_by_request.values()))} to "
                    f"{ms(max(v['mean'] for v in s.itl_by_request.values()))}")
    rows.append(f"requests {s.requests}, failed {s.failed}{und}; prefilled {s.prefilled_tokens} tokens, "
                f"{s.cached_tokens} from the prefix cache")
    st = s.stages
    rows.append("mean split: " + ", ".join(f"{k} {ms(st.get(k, math.nan))}" for k in ("queue", "prefill", "delivery", "decode")))
    good = f"{s.goodput_rps:.2f} req/s" if not math.isnan(s.goodput_rps) else "n/a"
    rows.append(f"goodput {good} ({s.met_slo}/{s.requests} met SLO {format_slo(s.slo)}); throughput "
                f"{s.throughput_rps:.2f} req/s, {s.output_tok_per_s:.1f} output tok/s over {s.duration_s:.2f} s")
    return rows
