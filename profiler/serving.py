"""Serving experiments on the real model: arrivals, continuous batching, chunked prefill, prefix cache.

``serve(model, specs, chunk_budget=...)`` runs one configuration and returns a ``ServingRun``
whose ``timelines`` are ``roofline.latency.RequestTimeline``s. ``serve`` is the executor; the
decisions are ``profiler.scheduler.Scheduler``'s (pure, testable without a model). One step:

1. admit requests whose scheduled arrival (seconds after the start) has passed: tokenize
   (``profiler.tokenizer``), then queue them in the scheduler;
2. ask the scheduler for a ``StepPlan`` under the token budget: one decode token for each
   running request first, then prefill chunks: unfinished prompts in admission order, then
   queued requests while a KV slot is free or a parked one can be evicted (a prefix-cache hit
   copies the cached blocks into the new slot);
3. run it: set up the admitted slots (``model.reset`` / ``model.copy_prefix``), the decode
   batch (``model.decode_step``) and the chunks (``model.prefill``, repeated calls = chunked
   prefill), delivering each token through the streaming callback, and report each result
   back to the scheduler. A finished request (ok or failed) goes to ``on_finish`` at once.

Every timestamp comes from the clock, which on real hardware is ``profiler.timing.timestamp``
(device synced first). Tests inject a ``FakeClock`` that the fake model advances by a cost,
so the chunk trade-off is deterministic.

Prefix cache (vLLM's rule, see ``profiler.scheduler``): only full blocks (16 tokens by
default) are reused, matched by a chained hash of the block contents; at least the last
prompt token is always recomputed. A prompt's blocks become matchable when its prefill
completes (two prompts prefilling side by side do not share); a finished request's slot
keeps its KV (and its blocks stay matchable) until the slot is needed again (least recently
used first). ``PrefixCache``, ``block_hashes`` and ``BLOCK_SIZE`` live in
``profiler.scheduler`` and are re-exported here.

Failures: a request whose prefill or decode raises, or which cannot fit ``max_len``, is
marked failed with the error and stays in the metrics; its slot is reset.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field

from roofline.latency import RequestTimeline

from .scheduler import BLOCK_SIZE, PrefixCache, Scheduler, StepPlan, block_hashes
from .timing import timestamp
from .tokenizer import ByteTokenizer, StreamDecoder

__all__ = ["BLOCK_SIZE", "FakeClock", "PrefixCache", "RequestSpec", "ServingRun", "WallClock", "block_hashes",
           "serve", "warmup"]


@dataclass(frozen=True)
class RequestSpec:
    id: int
    arrival: float          # seconds after the start
    prompt: str
    output_tokens: int


class WallClock:
    """Monotonic time after a device sync (``profiler.timing.timestamp``); sleeping waits for arrivals."""

    def __init__(self, device=None):
        self.device = device

    def now(self) -> float:
        return timestamp(self.device)

    def sleep_until(self, t: float) -> None:
        dt = t - self.now()
        if dt > 0:
            time.sleep(dt)


class FakeClock:
    """A clock that moves only when told: ``advance(seconds)``; for deterministic tests."""

    def __init__(self):
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt

    def sleep_until(self, t: float) -> None:
        self.t = max(self.t, t)


@dataclass
class _Live:
    """The executor's record of one request: text, timestamps and status (progress is the scheduler's)."""

    spec: RequestSpec
    ids: list
    hashes: tuple
    tok: tuple
    queue_start: float
    slot: int = -1
    queue_end: float = math.nan
    cached: int = 0
    chunks: list = field(default_factory=list)
    selected: float = math.nan
    deliveries: list = field(default_factory=list)
    last: int = 0               # the last generated token (model id)
    finish: float = math.nan
    status: str = "ok"
    error: str = ""
    text: str = ""
    stream: StreamDecoder = field(default_factory=StreamDecoder)

    def timeline(self, config: str) -> RequestTimeline:
        return RequestTimeline(
            id=self.spec.id, arrival=self.spec.arrival, tokenize=self.tok, queue=(self.queue_start, self.queue_end),
            chunks=tuple(self.chunks), first_selected=self.selected, deliveries=tuple(self.deliveries),
            finish=self.finish, prompt_tokens=len(self.ids), cached_tokens=self.cached,
            output_tokens=self.spec.output_tokens, status=self.status, error=self.error, config=config,
            block_hashes=tuple(self.hashes))


@dataclass
class ServingRun:
    config: str
    timelines: list
    steps: list          # dicts: start, end, decode (requests), prefill (tokens)
    texts: dict          # request id -> streamed text


def serve(model, specs, *, chunk_budget: int | None = None, prefix_cache: bool = True,
          block_size: int = BLOCK_SIZE, clock=None, on_token=None, on_finish=None, config: str = "") -> ServingRun:
    """Run ``specs`` through a continuous-batching loop on ``model``; see the module docstring.

    ``chunk_budget``: tokens per step (decode tokens + prefill chunk tokens); None = no limit
    (a prompt is prefilled whole). ``on_token(request_id, model_id, text)`` is the streaming
    callback; a token counts as delivered when it returns. ``on_finish(timeline)`` is called
    once per request as soon as it finishes, ok or failed (at admission too), with its complete
    ``RequestTimeline``: the object that ends up in ``ServingRun.timelines``.
    """
    import torch

    sched = Scheduler(len(model.lengths), budget=chunk_budget, prefix_cache=prefix_cache, block_size=block_size)
    clock = clock or WallClock(getattr(model, "device", None))
    tok = ByteTokenizer()
    vocab = model.cfg.vocab
    pending = deque(sorted(specs, key=lambda s: (s.arrival, s.id)))
    live, done, steps = {}, [], []
    t0 = clock.now()
    now = lambda: clock.now() - t0  # noqa: E731

    def finish(r, status="ok", error=""):
        r.finish, r.status, r.error = now(), status, error
        if r.spec.id in sched.requests:
            slot = sched.on_finished(r.spec.id, failed=status != "ok")
            if slot is not None:
                model.reset(slot)
        r.text += r.stream.flush()
        del live[r.spec.id]
        t = r.timeline(config)
        done.append((r, t))
        if on_finish is not None:
            on_finish(t)

    def deliver(r, model_id: int):
        r.last = model_id
        piece = r.stream.push(model_id)
        r.text += piece
        if on_token is not None:
            on_token(r.spec.id, model_id, piece)
        r.deliveries.append(now())
        if sched.on_token_delivered(r.spec.id):
            finish(r)

    def arrive(spec):
        a = now()
        ids = tok.to_model(tok.encode(spec.prompt), vocab)
        b = now()
        if spec.output_tokens < 1:
            error = "output length must be at least 1"
        elif len(ids) + spec.output_tokens > model.max_len:
            error = f"prompt {len(ids)} + output {spec.output_tokens} tokens exceed max_len {model.max_len}"
        else:
            sched.add(spec.id, ids, spec.output_tokens)
            live[spec.id] = _Live(spec, ids, sched.requests[spec.id].hashes, (a, b), b)
            return
        live[spec.id] = r = _Live(spec, ids, tuple(block_hashes(ids, block_size)), (a, b), b)
        finish(r, "failed", error)

    def run(plan: StepPlan):
        for adm in plan.admit:                # slot set-up: keep, or reset then copy, the reused prefix
            r = live[adm.id]
            r.slot, r.cached, r.queue_end = adm.slot, adm.reused, now()
            if not adm.in_place:
                model.reset(adm.slot)
            if adm.reused:
                model.copy_prefix(adm.source, adm.slot, adm.reused)
        step = {"start": now(), "decode": len(plan.decode), "prefill": plan.prefill_tokens}
        if plan.decode:
            decoders = [live[i] for i in plan.decode]
            toks = torch.tensor([r.last for r in decoders], dtype=torch.long)
            slots = torch.tensor([r.slot for r in decoders], dtype=torch.long)
            try:
                nxt = model.greedy(model.decode_step(toks, slots)).tolist()
            except Exception as e:  # noqa: BLE001 - the batch fails, the run goes on
                for r in decoders:
                    finish(r, "failed", f"decode: {type(e).__name__}: {e}")
            else:
                for r, t in zip(decoders, nxt):
                    deliver(r, int(t))
        for c in plan.prefill:
            r = live[c.id]
            start = now()
            try:                              # only the final chunk's logits pick the first token
                logits = model.prefill(torch.tensor(r.ids[c.start:c.start + c.tokens], dtype=torch.long), r.slot,
                                       logits=c.final)
            except Exception as e:  # noqa: BLE001
                r.chunks.append((start, now(), c.tokens))
                finish(r, "failed", f"prefill: {type(e).__name__}: {e}")
                continue
            r.chunks.append((start, now(), c.tokens))
            if sched.on_prefilled(c.id, c.tokens):
                first = int(model.greedy(logits))
                r.selected = now()
                deliver(r, first)
        step["end"] = now()
        steps.append(step)

    while pending or sched.busy:
        while pending and pending[0].arrival <= now():
            arrive(pending.popleft())
        plan = sched.plan() if sched.busy else StepPlan()
        if plan.empty:                        # nothing runnable: wait for the next arrival
            if pending:
                clock.sleep_until(t0 + pending[0].arrival)
            continue
        run(plan)
    order = {s.id: i for i, s in enumerate(specs)}
    done.sort(key=lambda rt: order.get(rt[0].spec.id, 0))
    return ServingRun(config, [t for _, t in done], steps, {r.spec.id: r.text for r, _ in done})


def warmup(model) -> None:
    """One short prefill and decode step so the first request does not pay one-time setup costs."""
    import torch
    slot = 0
    model.reset(slot)
    model.prefill(torch.arange(4, dtype=torch.long) % model.cfg.vocab, slot)
    model.decode_step(torch.tensor([1], dtype=torch.long), torch.tensor([slot], dtype=torch.long))
    model.reset(slot)
