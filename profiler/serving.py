"""Serving experiments on the real model: arrivals, continuous batching, chunked prefill, prefix cache.

``serve(model, specs, chunk_budget=...)`` runs one configuration and returns a ``ServingRun``
whose ``timelines`` are ``roofline.latency.RequestTimeline``s. The loop, one step at a time:

1. admit requests whose scheduled arrival (seconds after the start) has passed: tokenize
   (``profiler.tokenizer``), then queue;
2. plan a step under the token budget: one decode token for each running request first,
   then prefill chunks: unfinished prompts in admission order, then queued requests while a
   KV slot is free (a prefix-cache hit copies the cached blocks into the new slot);
3. run the decode batch (``model.decode_step``) and the chunks (``model.prefill``, repeated
   calls = chunked prefill), delivering each token through the streaming callback.

Every timestamp comes from the clock, which on real hardware is ``profiler.timing.timestamp``
(device synced first). Tests inject a ``FakeClock`` that the fake model advances by a cost,
so the chunk trade-off is deterministic.

Prefix cache (vLLM's rule): only full blocks (16 tokens by default) are reused, matched by a
chained hash of the block contents; at least the last prompt token is always recomputed.
A prompt's blocks become matchable when its prefill completes (two prompts prefilling side
by side do not share); a finished request's slot keeps its KV (and its blocks stay
matchable) until the slot is needed again (least recently used first).

Failures: a request whose prefill or decode raises, or which cannot fit ``max_len``, is
marked failed with the error and stays in the metrics.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections import deque
from dataclasses import dataclass, field

from roofline.latency import RequestTimeline

from .timing import timestamp
from .tokenizer import ByteTokenizer, StreamDecoder

BLOCK_SIZE = 16


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


def block_hashes(ids, block: int = BLOCK_SIZE) -> list:
    """Chained hashes of the full blocks of ``ids``: h_i = H(h_{i-1}, block_i)."""
    out, prev = [], b""
    for i in range(len(ids) // block):
        h = hashlib.blake2b(prev + repr(tuple(ids[i * block:(i + 1) * block])).encode(), digest_size=8).hexdigest()
        out.append(h)
        prev = h.encode()
    return out


class PrefixCache:
    """block hash -> slot holding that block (and, the hash being chained, every block before it)."""

    def __init__(self, block: int = BLOCK_SIZE):
        self.block = block
        self.table: dict = {}

    def match(self, hashes, prompt_len: int) -> tuple:
        """(slot, reusable tokens): full blocks only, never the last prompt token."""
        k, slot = 0, None
        for h in hashes:
            if h not in self.table:
                break
            k, slot = k + 1, self.table[h]
        limit = ((prompt_len - 1) // self.block) * self.block
        n = min(k * self.block, limit)
        return (slot, n) if n > 0 else (None, 0)

    def register(self, hashes, slot: int) -> None:
        for h in hashes:
            self.table[h] = slot

    def evict(self, slot: int) -> None:
        self.table = {h: s for h, s in self.table.items() if s != slot}


@dataclass
class _Live:
    spec: RequestSpec
    ids: list
    hashes: list
    tok: tuple
    queue_start: float
    slot: int = -1
    queue_end: float = math.nan
    done: int = 0               # prompt tokens in the KV cache (cached + prefilled)
    cached: int = 0
    chunks: list = field(default_factory=list)
    selected: float = math.nan
    deliveries: list = field(default_factory=list)
    last: int = 0               # the last generated token (model id)
    finish: float = math.nan
    status: str = "ok"
    error: str = ""
    text: str = ""

    @property
    def prefilled(self) -> bool:
        return self.done >= len(self.ids)

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
          block_size: int = BLOCK_SIZE, clock=None, on_token=None, config: str = "") -> ServingRun:
    """Run ``specs`` through a continuous-batching loop on ``model``; see the module docstring.

    ``chunk_budget``: tokens per step (decode tokens + prefill chunk tokens); None = no limit
    (a prompt is prefilled whole). ``on_token(request_id, model_id, text)`` is the streaming
    callback; a token counts as delivered when it returns.
    """
    import torch

    if chunk_budget is not None and chunk_budget < 1:
        raise ValueError("the chunk budget must be at least one token per step.")
    clock = clock or WallClock(getattr(model, "device", None))
    tok = ByteTokenizer()
    vocab = model.cfg.vocab
    n_slots = len(model.lengths)
    cache = PrefixCache(block_size) if prefix_cache else None
    free = deque(range(n_slots))          # never used or reset
    parked = deque()                      # finished, KV kept for prefix reuse (LRU first)
    pending = deque(sorted(specs, key=lambda s: (s.arrival, s.id)))
    waiting, running, done, steps = deque(), [], [], []
    streams = {}
    t0 = clock.now()
    now = lambda: clock.now() - t0  # noqa: E731

    def finish(r, status="ok", error=""):
        r.finish, r.status, r.error = now(), status, error
        if r in running:
            running.remove(r)
        if r.slot >= 0:
            if status == "ok" and cache is not None:
                parked.append(r.slot)
            else:
                model.reset(r.slot)
                if cache is not None:
                    cache.evict(r.slot)
                free.append(r.slot)
        r.text += streams.pop(r.spec.id).flush()
        done.append(r)

    def deliver(r, model_id: int):
        r.last = model_id
        piece = streams[r.spec.id].push(model_id)
        r.text += piece
        if on_token is not None:
            on_token(r.spec.id, model_id, piece)
        r.deliveries.append(now())
        if len(r.deliveries) >= r.spec.output_tokens:
            finish(r)

    def take_slot(keep):
        if free:
            return free.popleft()
        victims = [s for s in parked if s != keep] or list(parked)
        s = victims[0]                      # least recently used, sparing the prefix source
        parked.remove(s)
        cache.evict(s)
        return s

    def admit(r):
        src, n = cache.match(r.hashes, len(r.ids)) if cache is not None else (None, 0)
        r.slot = take_slot(src)
        r.queue_end = now()
        if n and src == r.slot:            # the only slot to take holds the prefix: keep its first n tokens
            model.copy_prefix(src, src, n)
        else:
            model.reset(r.slot)
            if n:
                if src in parked:          # just used: last in line for eviction
                    parked.remove(src)
                    parked.append(src)
                model.copy_prefix(src, r.slot, n)
        r.done = r.cached = n
        running.append(r)

    while pending or waiting or running:
        while pending and pending[0].arrival <= now():
            spec = pending.popleft()
            a = now()
            ids = tok.to_model(tok.encode(spec.prompt), vocab)
            b = now()
            r = _Live(spec, ids, block_hashes(ids, block_size), (a, b), b)
            streams[spec.id] = StreamDecoder()
            if spec.output_tokens < 1:
                finish(r, "failed", "output length must be at least 1")
            elif len(ids) + spec.output_tokens > model.max_len:
                finish(r, "failed", f"prompt {len(ids)} + output {spec.output_tokens} tokens exceed max_len "
                       f"{model.max_len}")
            else:
                waiting.append(r)
        if not waiting and not running:
            if pending:
                clock.sleep_until(t0 + pending[0].arrival)
            continue
        # ---- plan: decode tokens first, then prefill chunks, within the budget
        left = math.inf if chunk_budget is None else chunk_budget
        ready = [r for r in running if r.prefilled]
        decoders = ready[: int(min(left, n_slots))]
        left -= len(decoders)
        if len(decoders) < len(ready):      # budget below the batch: round robin
            for r in decoders:
                running.remove(r)
                running.append(r)
        plan = []
        for r in [r for r in running if not r.prefilled]:
            if left <= 0:
                break
            n = int(min(len(r.ids) - r.done, left))
            plan.append((r, n))
            left -= n
        while left > 0 and waiting and (free or parked):
            r = waiting.popleft()
            admit(r)
            n = int(min(len(r.ids) - r.done, left))
            plan.append((r, n))
            left -= n
        if not decoders and not plan:       # nothing runnable: wait for the next arrival
            if pending:
                clock.sleep_until(t0 + pending[0].arrival)
            continue
        # ---- run
        step = {"start": now(), "decode": len(decoders), "prefill": sum(n for _, n in plan)}
        if decoders:
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
        for r, n in plan:
            start = now()
            try:
                last = r.done + n >= len(r.ids)  # only the final chunk's logits pick the first token
                logits = model.prefill(torch.tensor(r.ids[r.done:r.done + n], dtype=torch.long), r.slot,
                                       logits=last)
            except Exception as e:  # noqa: BLE001
                r.chunks.append((start, now(), n))
                finish(r, "failed", f"prefill: {type(e).__name__}: {e}")
                continue
            r.chunks.append((start, now(), n))
            r.done += n
            if r.prefilled:
                first = int(model.greedy(logits))
                r.selected = now()
                if cache is not None:
                    cache.register(r.hashes, r.slot)
                deliver(r, first)
        step["end"] = now()
        steps.append(step)
    order = {s.id: i for i, s in enumerate(specs)}
    done.sort(key=lambda r: order.get(r.spec.id, 0))
    return ServingRun(config, [r.timeline(config) for r in done], steps, {r.spec.id: r.text for r in done})


def warmup(model) -> None:
    """One short prefill and decode step so the first request does not pay one-time setup costs."""
    import torch
    slot = 0
    model.reset(slot)
    model.prefill(torch.arange(4, dtype=torch.long) % model.cfg.vocab, slot)
    model.decode_step(torch.tensor([1], dtype=torch.long), torch.tensor([slot], dtype=torch.long))
    model.reset(slot)
