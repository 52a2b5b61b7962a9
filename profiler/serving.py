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

Speculative decoding (``serve(..., draft=D, spec_k=K)``, ``profiler.speculation``): the decode batch becomes
one round per request (the draft's K decode steps, batched; one verify step of the target per request over its
cached prefix; greedy or rejection-sampled verification; both caches cut back), and its n + 1 tokens are
delivered together. The step's record gains ``rounds`` ([id, drafted, accepted, decisions "AAR"]), ``drafted``
and ``accepted``.

Failures: a request whose prefill or decode raises, or which cannot fit ``max_len``, is
marked failed with the error and stays in the metrics; its slot is reset.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field

from roofline.errors import RooflineError
from roofline.latency import RequestTimeline

from .scheduler import BLOCK_SIZE, PrefixCache, Scheduler, StepPlan, block_hashes
from .speculation import Sampler, check_draft, speculate
from .timing import timestamp
from .tokenizer import ByteTokenizer, StreamDecoder

__all__ = ["BLOCK_SIZE", "Engine", "FakeClock", "PrefixCache", "RequestSpec", "ServingRun", "WallClock", "block_hashes",
           "serve", "warmup"]


@dataclass(frozen=True)
class RequestSpec:
    id: int
    arrival: float          # seconds after the start
    prompt: str
    output_tokens: int      # the most tokens generated (all of them unless a stop id comes first)
    stop_ids: tuple = ()    # model ids that end the request early (end of sequence), ...
    min_tokens: int = 0     # ... once at least this many tokens were generated


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


class Engine:
    """The executor of one configuration: requests ``arrive``, each ``step()`` runs one ``StepPlan``.

    ``serve`` drives it from a list of arrivals; ``profiler.server`` from HTTP requests (one
    engine thread). ``cancel(id)`` finishes a request early as failed (a client went away): its
    slot is reset and freed. A request whose ``RequestSpec.stop_ids`` holds the token just
    generated, after at least ``min_tokens``, finishes early as ok (an end-of-sequence token).
    Times are seconds since the engine was made (``now()``).

    ``sampler`` (``profiler.speculation.Sampler``) picks each token: greedy by default. With a ``draft`` model and
    ``spec_k`` drafts per verify step the decode batch speculates (``profiler.speculation.speculate``): the draft's
    KV cache mirrors the target's (the same slots reset, prefixes copied, prompts prefilled), each decoder gets
    min(K, tokens it still needs - 1) drafts, and every round is recorded in the step's ``rounds``.
    """

    def __init__(self, model, *, chunk_budget: int | None = None, prefix_cache: bool = True,
                 block_size: int = BLOCK_SIZE, clock=None, on_token=None, on_finish=None, config: str = "",
                 sampler: Sampler | None = None, draft=None, spec_k: int = 0):
        self.model = model
        self.sampler = sampler or Sampler()
        if (draft is None) != (spec_k < 1):
            raise ValueError("speculation needs both a draft model and spec_k >= 1 drafts per verify step.")
        if draft is not None:
            check_draft(model, draft)
        self.draft, self.spec_k = draft, spec_k
        cfg = getattr(model, "cfg", None)
        kind = ("Gated DeltaNet" if getattr(cfg, "linear_layers", ()) else "Mamba-2" if getattr(cfg, "mamba_layers", ())
                else "")                     # kernels.model keeps a DeltaNet or Mamba-2 state at a slot's end only
        if prefix_cache and kind:
            raise RooflineError(f"{cfg.name}: its {kind} layers keep their state after a slot's last token only, so a "
                                "prefix cache cannot reuse part of a prompt: run with --no-prefix-cache.")
        self.sched = Scheduler(len(model.lengths), budget=chunk_budget, prefix_cache=prefix_cache,
                               block_size=block_size)
        self.clock = clock or WallClock(getattr(model, "device", None))
        self.block_size, self.config = block_size, config
        self.on_token, self.on_finish = on_token, on_finish
        self.tok = ByteTokenizer()
        self.live, self.done, self.steps = {}, [], []
        self.t0 = self.clock.now()

    def now(self) -> float:
        return self.clock.now() - self.t0

    @property
    def busy(self) -> bool:
        return self.sched.busy

    def _finish(self, r, status="ok", error=""):
        r.finish, r.status, r.error = self.now(), status, error
        if r.spec.id in self.sched.requests:
            slot = self.sched.on_finished(r.spec.id, failed=status != "ok")
            if slot is not None:
                self._models(lambda m: m.reset(slot))
        r.text += r.stream.flush()
        del self.live[r.spec.id]
        t = r.timeline(self.config)
        self.done.append((r, t))
        if self.on_finish is not None:
            self.on_finish(t)

    def _deliver(self, r, model_id: int):
        r.last = model_id
        piece = r.stream.push(model_id)
        r.text += piece
        if self.on_token is not None:
            self.on_token(r.spec.id, model_id, piece)
        r.deliveries.append(self.now())
        if self.sched.on_token_delivered(r.spec.id):
            self._finish(r)
        elif model_id in r.spec.stop_ids and len(r.deliveries) >= r.spec.min_tokens:
            self._finish(r)

    def arrive(self, spec: RequestSpec) -> None:
        """Tokenize and queue ``spec`` now (a request that cannot fit ``max_len`` fails at once)."""
        model = self.model
        a = self.now()
        ids = self.tok.to_model(self.tok.encode(spec.prompt), model.cfg.vocab)
        b = self.now()
        if spec.output_tokens < 1:
            error = "output length must be at least 1"
        elif len(ids) + spec.output_tokens > model.max_len:
            error = f"prompt {len(ids)} + output {spec.output_tokens} tokens exceed max_len {model.max_len}"
        else:
            self.sched.add(spec.id, ids, spec.output_tokens)
            self.live[spec.id] = _Live(spec, ids, self.sched.requests[spec.id].hashes, (a, b), b)
            return
        self.live[spec.id] = r = _Live(spec, ids, tuple(block_hashes(ids, self.block_size)), (a, b), b)
        self._finish(r, "failed", error)

    def cancel(self, rid: int, reason: str = "cancelled") -> bool:
        """Finish request ``rid`` now as failed (its slot is reset and freed); False if it is not live."""
        r = self.live.get(rid)
        if r is None:
            return False
        self._finish(r, "failed", reason)
        return True

    def step(self) -> bool:
        """Plan and run one step; False when there was nothing to run."""
        plan = self.sched.plan() if self.sched.busy else StepPlan()
        if plan.empty:
            return False
        self._run(plan)
        return True

    def _models(self, fn):
        """``fn`` on the target, then on the draft (whose KV cache mirrors the target's)."""
        fn(self.model)
        if self.draft is not None:
            fn(self.draft)

    def _run(self, plan: StepPlan):
        import torch

        model, live, now = self.model, self.live, self.now
        for adm in plan.admit:                # slot set-up: keep, or reset then copy, the reused prefix
            r = live[adm.id]
            r.slot, r.cached, r.queue_end = adm.slot, adm.reused, now()
            if not adm.in_place:
                self._models(lambda m: m.reset(adm.slot))
            if adm.reused:
                self._models(lambda m: m.copy_prefix(adm.source, adm.slot, adm.reused))
        step = {"start": now(), "decode": len(plan.decode), "prefill": plan.prefill_tokens}
        if plan.decode and self.draft is not None:
            self._speculate([live[i] for i in plan.decode], step)
        elif plan.decode:
            decoders = [live[i] for i in plan.decode]
            toks = torch.tensor([r.last for r in decoders], dtype=torch.long)
            slots = torch.tensor([r.slot for r in decoders], dtype=torch.long)
            try:
                nxt = self.sampler.pick(model.decode_step(toks, slots))
            except Exception as e:  # noqa: BLE001 - the batch fails, the run goes on
                for r in decoders:
                    self._finish(r, "failed", f"decode: {type(e).__name__}: {e}")
            else:
                for r, t in zip(decoders, nxt):
                    if r.spec.id in live:     # a callback may have cancelled it meanwhile
                        self._deliver(r, int(t))
        for c in plan.prefill:
            r = live.get(c.id)
            if r is None:                     # cancelled during this step
                continue
            start = now()
            try:                              # only the final chunk's logits pick the first token
                chunk = torch.tensor(r.ids[c.start:c.start + c.tokens], dtype=torch.long)
                logits = model.prefill(chunk, r.slot, logits=c.final)
                if self.draft is not None:
                    self.draft.prefill(chunk, r.slot, logits=False)
            except Exception as e:  # noqa: BLE001
                r.chunks.append((start, now(), c.tokens))
                self._finish(r, "failed", f"prefill: {type(e).__name__}: {e}")
                continue
            r.chunks.append((start, now(), c.tokens))
            if self.sched.on_prefilled(c.id, c.tokens):
                first = self.sampler.pick(logits)[0]
                r.selected = now()
                self._deliver(r, first)
        step["end"] = now()
        self.steps.append(step)

    def _speculate(self, decoders, step):
        """One speculative round per decoder (draft, verify, roll back), its tokens delivered in order."""
        reqs = self.sched.requests
        work = [(r.spec.id, r.slot, r.last,
                 max(0, min(self.spec_k, reqs[r.spec.id].output_tokens - reqs[r.spec.id].generated - 1)))
                for r in decoders]
        try:
            results = speculate(self.model, self.draft, self.sampler, work)
        except Exception as e:  # noqa: BLE001 - the batch fails, the run goes on
            for r in decoders:
                self._finish(r, "failed", f"decode: {type(e).__name__}: {e}")
            return
        step["rounds"] = [rnd.to_list() for _, rnd in results]
        step["drafted"] = sum(rnd.drafted for _, rnd in results)
        step["accepted"] = sum(rnd.accepted for _, rnd in results)
        for r, (tokens, _) in zip(decoders, results):
            for t in tokens:
                if r.spec.id not in self.live:   # finished (its last token or a stop id) or cancelled
                    break
                self._deliver(r, int(t))


def serve(model, specs, *, chunk_budget: int | None = None, prefix_cache: bool = True,
          block_size: int = BLOCK_SIZE, clock=None, on_token=None, on_finish=None, config: str = "",
          sampler: Sampler | None = None, draft=None, spec_k: int = 0) -> ServingRun:
    """Run ``specs`` through a continuous-batching loop on ``model``; see the module docstring.

    ``chunk_budget``: tokens per step (decode tokens + prefill chunk tokens); None = no limit
    (a prompt is prefilled whole). ``on_token(request_id, model_id, text)`` is the streaming
    callback; a token counts as delivered when it returns. ``on_finish(timeline)`` is called
    once per request as soon as it finishes, ok or failed (at admission too), with its complete
    ``RequestTimeline``: the object that ends up in ``ServingRun.timelines``. ``sampler``, ``draft`` and
    ``spec_k``: as ``Engine``'s (greedy, no speculation by default).
    """
    eng = Engine(model, chunk_budget=chunk_budget, prefix_cache=prefix_cache, block_size=block_size, clock=clock,
                 on_token=on_token, on_finish=on_finish, config=config, sampler=sampler, draft=draft, spec_k=spec_k)
    pending = deque(sorted(specs, key=lambda s: (s.arrival, s.id)))
    while pending or eng.busy:
        while pending and pending[0].arrival <= eng.now():
            eng.arrive(pending.popleft())
        if not eng.step() and pending:        # nothing runnable: wait for the next arrival
            eng.clock.sleep_until(eng.t0 + pending[0].arrival)
    order = {s.id: i for i, s in enumerate(specs)}
    done = sorted(eng.done, key=lambda rt: order.get(rt[0].spec.id, 0))
    return ServingRun(config, [t for _, t in done], eng.steps, {r.spec.id: r.text for r, _ in done})


def warmup(model) -> None:
    """One short prefill and decode step so the first request does not pay one-time setup costs."""
    import torch
    slot = 0
    model.reset(slot)
    model.prefill(torch.arange(4, dtype=torch.long) % model.cfg.vocab, slot)
    model.decode_step(torch.tensor([1], dtype=torch.long), torch.tensor([slot], dtype=torch.long))
    model.reset(slot)
