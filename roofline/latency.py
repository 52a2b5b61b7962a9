"""What the user sees: TTFT / TPOT / ITL / E2E over many requests, goodput, SLOs (pure).

Each request's timestamps are a ``RequestTimeline`` (``roofline.timeline``, re-exported here):

    arrival -> tokenize start/end -> queue start/end -> prefill chunk start/end (1+)
    -> first token selected -> first token delivered -> later tokens delivered -> finish

Metrics (names clash across tools, so the formulas travel with the numbers, ``FORMULAS``):

    TTFT   = first delivery - arrival
    TPOT   = (last delivery - first delivery) / (n - 1), per request; undefined for n = 1
    ITL    = each gap between consecutive deliveries (pooled over requests, and per request)
    E2E    = finish - arrival
    goodput = requests meeting every SLO given (TTFT, TPOT, E2E) / run duration

A failed request stays in the counts: it meets no SLO and is reported as failed.

Measured from outside a server (``profiler.endpoint``, an OpenAI-compatible stream), a
timeline also holds ``sent`` (the request left the client, after any wait for a
concurrency slot) and the metrics are vLLM ``bench serve``'s (``ENDPOINT_FORMULAS``): TTFT
and E2E start at ``sent``, ``deliveries`` are the output tokens as received, and a chunk
carrying k tokens splits its gap evenly (``chunk_tokens`` keeps the chunks, so vLLM's
per-chunk ITL is ``chunk_itls``). Both kinds of file read alike.

The seed's worked example, as stage durations (``timeline_from_stages``):
queue 20 ms + prefill 80 ms + delivery 5 ms -> TTFT 105 ms; 3 x 25 ms gaps -> finish 180 ms.

>>> t = timeline_from_stages(queue=0.020, prefill=0.080, first_delivery=0.005, gaps=(0.025,) * 3)
>>> round(t.ttft * 1e3, 6), round(t.e2e * 1e3, 6), round(t.tpot * 1e3, 6)
(105.0, 180.0, 25.0)
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from .errors import RooflineError
from .stats import quantile
from .timeline import (TOKEN_COUNTS, RequestTimeline, ServingStep, nan_stats, read_time,  # noqa: F401 - re-exported
                       timeline_from_stages, whole_number)
from .units import ms  # noqa: F401 - the latency tables' formatter, re-exported

FORMULAS = (
    "TTFT = first token delivered - arrival",
    "TPOT = (last delivery - first delivery) / (n - 1) per request (undefined for n = 1)",
    "ITL = each gap between consecutive deliveries (pooled over requests, and per request)",
    "E2E = finish - arrival",
    "goodput = requests meeting every SLO / (last finish - first arrival)",
)
ENDPOINT_FORMULAS = (
    "TTFT = first output chunk received - request sent (vLLM bench serve; client side: network, server queue, "
    "tokenization and prefill; not the client's wait for a concurrency slot)",
    "TPOT = (E2E - TTFT) / (n - 1) per request, n = output tokens (undefined for n = 1)",
    "ITL = each gap between consecutive output tokens: a chunk carrying k tokens splits its gap evenly into k "
    "(tokens in the first chunk arrive with it); chunk ITL = each gap between output chunks (vLLM's ITL)",
    "E2E = last output chunk received - request sent",
    "goodput = requests meeting every SLO / (last finish - first arrival)",
)
QUANTILES = (("p50", 0.50), ("p90", 0.90), ("p99", 0.99))
SLO_METRICS = ("ttft", "tpot", "e2e")


def stats(xs) -> dict:
    """p50, p90, p99 (linear interpolation, numpy's default), mean and max; NaN when empty."""
    a = np.asarray([x for x in xs if not math.isnan(x)], dtype=float)
    if a.size == 0:
        return {"n": 0, **{k: math.nan for k, _ in QUANTILES}, "mean": math.nan, "max": math.nan}
    out = {"n": int(a.size)}
    srt = sorted(float(x) for x in a)
    out.update({k: quantile(srt, q, is_sorted=True) for k, q in QUANTILES})
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
    chunk_itl: dict = field(default_factory=dict)    # gaps between output chunks (endpoint runs: vLLM's ITL)
    failures: dict = field(default_factory=dict)     # failed requests by reason (the error's text before ':')
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
    attempt: int = 1
    speculation: dict = field(default_factory=dict)   # acceptance, tokens per verify step (``speculation_line``)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["formulas"] = list(self.formulas)
        return {"type": "latency-summary", **d}

    @classmethod
    def from_dict(cls, d: dict) -> "LatencySummary":
        d = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        for k in ("ttft", "tpot", "itl", "e2e", "stages", "slo", "chunk_itl"):
            if k in d:
                d[k] = nan_stats(d[k])
        if not isinstance(d.get("failures", {}), dict):
            raise RooflineError("latency-summary 'failures' must be an object")
        if not isinstance(d.get("speculation", {}), dict):
            raise RooflineError("latency-summary 'speculation' must be an object")
        if "itl_by_request" in d:
            if not isinstance(d["itl_by_request"], dict):
                raise RooflineError("latency-summary 'itl_by_request' must be an object")
            d["itl_by_request"] = {str(k): nan_stats(v) for k, v in d["itl_by_request"].items()}
        for k in ("duration_s", "goodput_rps", "throughput_rps", "output_tok_per_s"):
            if k in d:
                d[k] = read_time(d[k], k)
        if not isinstance(d.get("config", ""), str) or not isinstance(d.get("settings", {}), dict):
            raise RooflineError("latency-summary 'config' must be a string and 'settings' an object")
        for k in ("requests", "failed", "tpot_undefined", "met_slo", "prefilled_tokens", "cached_tokens"):
            if k in d:
                d[k] = whole_number(d, k, "latency-summary")
        d["attempt"] = whole_number(d, "attempt", "latency-summary", default=1)
        d["formulas"] = tuple(d.get("formulas", FORMULAS))
        return cls(**d)


def failure_kind(error: str) -> str:
    """The reason class of a failed request: its error text before the first ':' ("http 500", "timeout", ...)."""
    return (error or "failed").split(":", 1)[0].strip() or "failed"


def summarize(timelines, slo: dict | None = None, config: str = "", settings: dict | None = None,
              formulas: tuple | None = None) -> LatencySummary:
    """Metrics over ``timelines``; failed requests are counted, never dropped.

    ``formulas``: default ``ENDPOINT_FORMULAS`` when the timelines were measured from a client
    (``sent`` set), else ``FORMULAS``.
    """
    ts = list(timelines)
    client = any(not math.isnan(t.sent) for t in ts)
    if formulas is None:
        formulas = ENDPOINT_FORMULAS if client else FORMULAS
    failures: dict = {}
    for t in ts:
        if not t.ok:
            k = failure_kind(t.error)
            failures[k] = failures.get(k, 0) + 1
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
        itl_by_request={str(t.id): stats(t.itls) for t in ok if t.n > 1},
        chunk_itl=stats(g for t in ok for g in t.chunk_itls) if client else {}, failures=failures,
        e2e=stats(t.e2e for t in ok), stages=stages,
        slo=slo, met_slo=met, goodput_rps=rate(met), throughput_rps=rate(len(ok)),
        output_tok_per_s=rate(sum(t.n for t in ok)),
        prefilled_tokens=sum(t.prefilled_tokens for t in ts), cached_tokens=sum(t.cached_tokens for t in ts),
        formulas=tuple(formulas))


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
    if s.chunk_itl.get("n"):
        c = s.chunk_itl
        rows.append(f"chunk ITL (vLLM's ITL: gaps between output chunks): p50 {ms(c['p50'])}, p99 {ms(c['p99'])}, "
                    f"mean {ms(c['mean'])}, n {c['n']}")
    why = f" ({', '.join(f'{k}: {v}' for k, v in s.failures.items())})" if s.failures else ""
    if not s.chunk_itl:                       # in-process: the loop's own stages
        rows.append(f"requests {s.requests}, failed {s.failed}{why}{und}; prefilled {s.prefilled_tokens} tokens, "
                    f"{s.cached_tokens} from the prefix cache")
        st = s.stages
        rows.append("mean split: " + ", ".join(f"{k} {ms(st.get(k, math.nan))}"
                                               for k in ("queue", "prefill", "delivery", "decode")))
    else:
        rows.append(f"requests {s.requests}, failed {s.failed}{why}{und}")
    if s.speculation:
        rows.append(speculation_line(s.speculation))
    good = f"{s.goodput_rps:.2f} req/s" if not math.isnan(s.goodput_rps) else "n/a"
    rows.append(f"goodput {good} ({s.met_slo}/{s.requests} met SLO {format_slo(s.slo)}); throughput "
                f"{s.throughput_rps:.2f} req/s, {s.output_tok_per_s:.1f} output tok/s over {s.duration_s:.2f} s")
    return rows


def _num(v, fmt: str) -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)


def plain_counterpart(summary, summaries):
    """The configuration that ran ``summary``'s requests without speculation (its label before ",spec="), for an
    in-process speculative run (its speculation has "rounds"); None otherwise (a server's counters: no run
    without)."""
    if "rounds" not in (summary.speculation or {}):
        return None
    base = summary.config.split(",spec=")[0]
    return next((o for o in summaries if o.config == base and o is not summary), None)


def speculation_line(sp: dict) -> str:
    """One line on a run's speculation: measured in process (rounds, drafted, accepted) or read from a server's
    counters (``source``) or gauges."""
    pos = sp.get("per_position") or []
    per = f"; per position {' / '.join(_num(p, '.2f') for p in pos)}" if pos else ""
    if "accept_length" in sp or "accept_rate" in sp:            # a server's gauges (SGLang): no counts
        return (f"speculation ({sp.get('source', 'server')}): acceptance {_num(sp.get('accept_rate'), '.3f')}, "
                f"{_num(sp.get('accept_length'), '.2f')} tokens per verify step (the server's recent mean)")
    if "rounds" in sp:                                           # in process: every round recorded
        return (f"speculation (K={sp.get('k')}, draft {sp.get('draft')}, {sp.get('verify')} verification): "
                f"acceptance {_num(sp.get('acceptance'), '.3f')} ({sp.get('accepted')}/{sp.get('drafted')} drafts "
                f"over {sp.get('rounds')} verify steps; decisions {sp.get('decisions_accepted')} accepted, "
                f"{sp.get('decisions_rejected')} rejected), {_num(sp.get('tokens_per_step'), '.2f')} tokens per "
                f"verify step{per}")
    return (f"speculation ({sp.get('source', 'server')}): acceptance {_num(sp.get('acceptance'), '.3f')} "
            f"({_num(sp.get('accepted'), 'g')}/{_num(sp.get('drafted'), 'g')} draft tokens over "
            f"{_num(sp.get('drafts'), 'g')} drafts), {_num(sp.get('tokens_per_step'), '.2f')} tokens per verify "
            f"step{per}")


@dataclass(frozen=True)
class LatencyRun:
    """One configuration of a latency file: its requests and their summary (recomputed from them).

    A resumed run may hold several attempts of a configuration: the latest complete one (with
    its summary line) is used; a configuration that never completed uses its latest partial
    attempt, with ``complete`` False (its requests were written as they finished).
    """

    config: str
    attempt: int
    timelines: tuple
    summary: LatencySummary
    complete: bool


def latency_runs(rf) -> list:
    """Per configuration, in file order: a ``LatencyRun`` (see its docstring)."""
    reqs: dict = {}
    sums: dict = {}
    for t in rf.requests:
        reqs.setdefault((t.config, t.attempt), []).append(t)
    for s in rf.summaries:
        sums[(s.config, s.attempt)] = s
    configs = list(dict.fromkeys(c for c, _ in list(reqs) + list(sums)))
    out = []
    for cfg in configs:
        attempts = sorted({a for c, a in list(reqs) + list(sums) if c == cfg})
        done = [a for a in attempts if (cfg, a) in sums]
        a = done[-1] if done else attempts[-1]
        ts = reqs.get((cfg, a), [])
        old = sums.get((cfg, a))
        if not ts and old is None:
            continue
        s = summarize(ts, old.slo if old else {}, cfg, old.settings if old else {}, old.formulas if old else None)
        if old is not None and old.speculation:                  # from the run's steps or server: not re-derivable
            s = replace(s, speculation=old.speculation)
        out.append(LatencyRun(cfg, a, tuple(ts), s, old is not None))
    return out
