"""A server's speculative-decoding counters, read from its Prometheus ``/metrics`` before and after a run.

The names, from the servers' sources:

* vLLM v1 (``vllm/v1/spec_decode/metrics.py``, ``SpecDecodingProm``): the counters
  ``vllm:spec_decode_num_drafts``, ``vllm:spec_decode_num_draft_tokens``, ``vllm:spec_decode_num_accepted_tokens``
  and ``vllm:spec_decode_num_accepted_tokens_per_pos`` (label ``position``), exposed by prometheus_client with the
  ``_total`` suffix, one sample per engine (summed here). Over a run (after - before): acceptance = accepted /
  draft tokens, tokens per verify step = 1 + accepted / drafts (vLLM's "mean acceptance length", the bonus token
  included), per-position acceptance = accepted at position j / drafts.
* SGLang (``python/sglang/srt/metrics/collector.py``, ``SchedulerMetricsCollector``): only the gauges
  ``sglang:spec_accept_length`` ("the average acceptance length") and ``sglang:spec_accept_rate`` (accepted /
  draft tokens), the scheduler's most recent logging interval, not counters: read after the run (averaged over
  its label sets), no delta.
* ``roofline serve --spec K`` exposes vLLM's four counters under the ``roofline:`` prefix.

A server without any of them (no speculation, or another engine) is said in one line by the caller, never an
error; a ``/metrics`` that cannot be read is the same.
"""

from __future__ import annotations

import math
import re

COUNTERS = ("spec_decode_num_drafts", "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens",
            "spec_decode_num_accepted_tokens_per_pos")
COUNTER_ENGINES = ("vllm", "roofline")            # prefixes that export vLLM's counters
GAUGES = {"sglang:spec_accept_length": "accept_length", "sglang:spec_accept_rate": "accept_rate"}
MAX_METRICS_BYTES = 16 << 20                      # a /metrics page larger than this is not read further
NO_COUNTERS = ("has no speculative-decoding counters (vLLM's vllm:spec_decode_*, SGLang's sglang:spec_accept_*): "
               "acceptance not reported")

_SAMPLE = re.compile(r'^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)')
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def samples(text: str) -> list:
    """Prometheus text exposition -> [(name, {label: value}, value)]; comments and unreadable lines skipped."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            v = float(m.group(3))
        except ValueError:
            continue
        out.append((m.group(1), dict(_LABEL.findall(m.group(2) or "")), v))
    return out


def read_spec(text: str | None) -> dict | None:
    """The speculative-decoding numbers a ``/metrics`` page holds, or None: {"engine", "drafts", "draft_tokens",
    "accepted", "per_position": {pos: accepted}} for vLLM's counters, {"engine": "sglang", "accept_length",
    "accept_rate"} for SGLang's gauges."""
    if not text:
        return None
    ss = samples(text)
    for engine in COUNTER_ENGINES:
        names = {f"{engine}:{c}": c for c in COUNTERS}
        got = {"drafts": 0.0, "draft_tokens": 0.0, "accepted": 0.0}
        per, seen = {}, False
        for name, labels, v in ss:
            base = name[:-len("_total")] if name.endswith("_total") else name
            c = names.get(base)
            if c is None or name.endswith("_created"):
                continue
            seen = True
            if c == "spec_decode_num_accepted_tokens_per_pos":
                pos = labels.get("position", "")
                if pos.isdigit():
                    per[int(pos)] = per.get(int(pos), 0.0) + v
            else:
                got[{"spec_decode_num_drafts": "drafts", "spec_decode_num_draft_tokens": "draft_tokens",
                     "spec_decode_num_accepted_tokens": "accepted"}[c]] += v
        if seen:
            return {"engine": engine, **got, "per_position": per}
    gauges: dict = {}
    for name, _, v in ss:
        if name in GAUGES and math.isfinite(v):
            gauges.setdefault(GAUGES[name], []).append(v)
    if gauges:
        return {"engine": "sglang", **{k: sum(vs) / len(vs) for k, vs in gauges.items()}}
    return None


def spec_delta(before: dict | None, after: dict | None, where: str = "/metrics") -> dict:
    """The run's speculation from two ``read_spec`` readings ({} when the server has none): counter deltas
    (acceptance, tokens per verify step, per-position acceptance) or, for gauges, the reading after the run."""
    if after is None:
        return {}
    if after["engine"] == "sglang":
        return {"source": f"{where}: SGLang's gauges after the run", **{k: after[k] for k in GAUGES.values()
                                                                       if k in after}}
    b = before if before is not None and before["engine"] == after["engine"] else \
        {"drafts": 0.0, "draft_tokens": 0.0, "accepted": 0.0, "per_position": {}}
    drafts, drafted, accepted = (after[k] - b[k] for k in ("drafts", "draft_tokens", "accepted"))
    per = {p: v - b["per_position"].get(p, 0.0) for p, v in after["per_position"].items()}
    return {"source": f"{where}: {after['engine']}:spec_decode_* counters, after - before the run",
            "drafts": drafts, "drafted": drafted, "accepted": accepted,
            "acceptance": accepted / drafted if drafted > 0 else math.nan,
            "tokens_per_step": 1 + accepted / drafts if drafts > 0 else math.nan,
            "per_position": [per[p] / drafts if drafts > 0 else math.nan for p in sorted(per)]}


async def fetch_metrics(client) -> str | None:
    """``GET /metrics`` as text (at most ``MAX_METRICS_BYTES``), or None when the server offers none or fails."""
    import httpx

    try:
        async with client.stream("GET", "/metrics") as r:
            if r.status_code != 200:
                return None
            buf = bytearray()
            async for chunk in r.aiter_bytes():
                buf += chunk
                if len(buf) > MAX_METRICS_BYTES:
                    break
            return bytes(buf[:MAX_METRICS_BYTES]).decode("utf-8", "replace")
    except (httpx.HTTPError, OSError):
        return None
