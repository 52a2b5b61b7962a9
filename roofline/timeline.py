"""One request's timestamps, and one scheduler step: the records a latency run writes (pure).

A ``RequestTimeline`` holds monotonic timestamps in seconds since the run started, each
taken after a device sync (``profiler.timing.timestamp``) in-process, or as the client
received them from a server (``profiler.endpoint``):

    arrival -> tokenize start/end -> queue start/end -> prefill chunk start/end (1+)
    -> first token selected -> first token delivered -> later tokens delivered -> finish

Its metrics (TTFT, TPOT, ITL, E2E) are derived properties; ``roofline.latency`` summarizes
many of them. ``from_dict`` validates a result-file line (null stands for an undefined time); ``read_time``,
``whole_number`` and ``nan_stats`` are the field readers ``roofline.latency`` reads its summary lines with.

>>> t = timeline_from_stages(queue=0.020, prefill=0.080, first_delivery=0.005, gaps=(0.025,) * 3)
>>> round(t.ttft * 1e3, 6), round(t.e2e * 1e3, 6), round(t.tpot * 1e3, 6)
(105.0, 180.0, 25.0)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from .errors import RooflineError

TOKEN_COUNTS = {
    "usage per chunk": "each chunk's tokens from the usage it carries (stream_options.continuous_usage_stats)",
    "one per chunk": "one token per output chunk; the usage total agrees",
    "spread from usage": "the usage total exceeds the output chunks: the extra tokens are spread evenly over the "
                         "chunks after the first",
    "chunks, usage disagrees": "one token per output chunk; the usage total reports fewer",
    "one per chunk, no usage": "one token per output chunk; the server reported no usage",
    "usage beyond the request": "one token per output chunk; the usage reports more tokens than max_tokens asked "
                                "for, which cannot be: it is kept (served_output_tokens) but not believed",
    "chunks beyond the request": "one token per output chunk; the server streamed more chunks than max_tokens "
                                 "asked for",
}


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
    attempt: int = 1                         # which run of this configuration (a resumed run adds one)
    # measured from outside a server (profiler.endpoint); defaults = an in-process run
    sent: float = math.nan                   # the request left the client: TTFT and E2E start here when set
    chunk_tokens: tuple = ()                 # tokens carried by each output chunk received (sum = n); () = one each
    served_prompt_tokens: int | None = None  # as the server reported (usage); None = not reported
    served_output_tokens: int | None = None
    token_counts: str = ""                   # how chunk_tokens were known: a TOKEN_COUNTS key; "" in-process

    # ---- derived ----
    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def n(self) -> int:
        return len(self.deliveries)

    @property
    def start(self) -> float:
        """Where TTFT and E2E start: ``sent`` when the request was measured from a client, else ``arrival``."""
        return self.arrival if math.isnan(self.sent) else self.sent

    @property
    def prompt_len(self) -> int:
        """The prompt as served: the server's count when it reported one, else ``prompt_tokens``."""
        return self.prompt_tokens if self.served_prompt_tokens is None else self.served_prompt_tokens

    @property
    def ttft(self) -> float:
        return self.deliveries[0] - self.start if self.deliveries else math.nan

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
    def chunk_times(self) -> list:
        """When each output chunk arrived (the delivery of its last token); one per delivery in-process."""
        if not self.chunk_tokens:
            return list(self.deliveries)
        ends = np.cumsum(self.chunk_tokens) - 1
        return [self.deliveries[int(i)] for i in ends]

    @property
    def chunk_itls(self) -> list:
        """Gaps between output chunks: vLLM bench serve's ITL."""
        c = self.chunk_times
        return [b - a for a, b in zip(c, c[1:])]

    @property
    def e2e(self) -> float:
        return self.finish - self.start

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
        d["chunk_tokens"] = list(self.chunk_tokens)
        if math.isnan(self.sent) and not self.token_counts:      # an in-process request: no client fields
            for k in ("sent", "chunk_tokens", "served_prompt_tokens", "served_output_tokens", "token_counts"):
                del d[k]
        return {"type": "request", **d}

    @classmethod
    def from_dict(cls, d: dict) -> "RequestTimeline":
        """Read a ``request`` line; null stands for an undefined time (NaN). RooflineError names a bad field."""
        what = "request"
        out = {"id": whole_number(d, "id", what), "arrival": read_time(d.get("arrival"), "arrival", allow_nan=False)}
        for k in ("tokenize", "queue"):
            v = d.get(k, (math.nan, math.nan))
            if not isinstance(v, (list, tuple)) or len(v) != 2:
                raise RooflineError(f"{what} {k!r} must be a [start, end] pair, not {v!r}")
            out[k] = tuple(read_time(x, k) for x in v)
        chunks = d.get("chunks", [])
        if not isinstance(chunks, (list, tuple)):
            raise RooflineError(f"{what} 'chunks' must be a list of [start, end, tokens], not {chunks!r}")
        out["chunks"] = []
        for c in chunks:
            if not isinstance(c, (list, tuple)) or len(c) != 3:
                raise RooflineError(f"{what} chunk {c!r} must be [start, end, tokens]")
            out["chunks"].append((read_time(c[0], "chunk start"), read_time(c[1], "chunk end"), whole_number({"n": c[2]}, "n", "chunk")))
        out["chunks"] = tuple(out["chunks"])
        out["first_selected"] = read_time(d.get("first_selected"), "first_selected")
        dl = d.get("deliveries", [])
        if not isinstance(dl, (list, tuple)):
            raise RooflineError(f"{what} 'deliveries' must be a list of times, not {dl!r}")
        out["deliveries"] = tuple(read_time(x, "delivery", allow_nan=False) for x in dl)
        if any(b < a for a, b in zip(out["deliveries"], out["deliveries"][1:])):
            raise RooflineError(f"{what} {out['id']}: deliveries must not go back in time")
        out["finish"] = read_time(d.get("finish"), "finish")
        for k in ("prompt_tokens", "cached_tokens", "output_tokens"):
            out[k] = whole_number(d, k, what, default=0)
        for k in ("status", "error", "config"):
            v = d.get(k, "ok" if k == "status" else "")
            if not isinstance(v, str):
                raise RooflineError(f"{what} {k!r} must be a string, not {v!r}")
            out[k] = v
        if out["status"] not in ("ok", "failed"):
            raise RooflineError(f"{what} 'status' must be ok or failed, not {out['status']!r}")
        out["block_hashes"] = tuple(str(h) for h in d.get("block_hashes", ()) or ())
        out["attempt"] = whole_number(d, "attempt", what, default=1)
        out["sent"] = read_time(d.get("sent"), "sent")
        ct = d.get("chunk_tokens") or []
        if not isinstance(ct, (list, tuple)):
            raise RooflineError(f"{what} 'chunk_tokens' must be a list of token counts, not {ct!r}")
        out["chunk_tokens"] = tuple(whole_number({"n": x}, "n", "chunk_tokens entry") for x in ct)
        if out["chunk_tokens"] and (sum(out["chunk_tokens"]) != len(out["deliveries"]) or 0 in out["chunk_tokens"]):
            raise RooflineError(f"{what} {out['id']}: chunk_tokens {list(ct)} must be counts of at least 1 adding up to "
                                f"the {len(out['deliveries'])} deliveries")
        for k in ("served_prompt_tokens", "served_output_tokens"):
            out[k] = None if d.get(k) is None else whole_number(d, k, what)
        tc = d.get("token_counts", "")
        if not isinstance(tc, str):
            raise RooflineError(f"{what} 'token_counts' must be a string, not {tc!r}")
        out["token_counts"] = tc
        return cls(**out)


def read_time(x, what: str, allow_nan: bool = True) -> float:
    """A timestamp from a result line: a finite number, or null / NaN (undefined) where allowed."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        if allow_nan:
            return math.nan
        raise RooflineError(f"{what} must be a number of seconds, not {x!r}")
    if isinstance(x, bool) or not isinstance(x, (int, float)) or math.isinf(x):
        raise RooflineError(f"{what} must be a finite number of seconds, not {x!r}")
    return float(x)


def whole_number(d: dict, key: str, what: str, default=None) -> int:
    """``d[key]`` from a result line: a whole number >= 0 (``default`` when absent), else a RooflineError."""
    v = d.get(key, default)
    if v is None or isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v) or v < 0:
        raise RooflineError(f"{what} {key!r} must be a whole number >= 0, not {v!r}")
    return int(v)


def nan_stats(st) -> dict:
    """A stats dict read back from JSON: null -> NaN."""
    if not isinstance(st, dict):
        raise RooflineError(f"latency statistics must be an object, not {st!r}")
    return {k: (math.nan if v is None else v) for k, v in st.items()}


@dataclass(frozen=True)
class ServingStep:
    """One step of the serving loop: when it ran, how many decode tokens and prefill tokens it took."""

    config: str
    start: float
    end: float
    decode: int = 0       # requests that decoded one token
    prefill: int = 0      # prompt tokens prefilled
    attempt: int = 1

    def to_dict(self) -> dict:
        return {"type": "latency-step", **asdict(self)}

    @classmethod
    def from_dict(cls, d: dict) -> "ServingStep":
        what = "latency-step"
        cfg = d.get("config", "")
        if not isinstance(cfg, str):
            raise RooflineError(f"{what} 'config' must be a string, not {cfg!r}")
        return cls(config=cfg, start=read_time(d.get("start"), "start", False), end=read_time(d.get("end"), "end", False),
                   decode=whole_number(d, "decode", what, 0), prefill=whole_number(d, "prefill", what, 0),
                   attempt=whole_number(d, "attempt", what, 1))


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
