"""The serving loop's scheduling, pure: which requests decode, prefill and get a KV slot each step.

No model, no torch, no clock: ``Scheduler`` owns the queue state (waiting requests, running
requests, free KV slots, parked slots in LRU order, the ``PrefixCache``) and turns it into one
``StepPlan`` per step. The executor (``profiler.serving.serve``) runs the plan on the model and
reports back what happened (``on_prefilled``, ``on_token_delivered``, ``on_finished``), which
moves the state on. The rules (vLLM's):

- **Budget.** A step spends at most ``budget`` tokens (decode tokens + prefill chunk tokens);
  ``None`` = no limit, so a prompt is prefilled whole in one chunk.
- **Decode first.** Every running request whose prompt is fully prefilled decodes one token,
  in running order. If the budget is below that decode batch, the first ``budget`` of them
  decode and move to the back of the running order: round robin across steps.
- **Then prefill chunks**, with what is left of the budget: first the unfinished prompts of
  running requests, in admission order (each gets ``min(remaining prompt, budget left)``),
- **then admissions**: queued requests, first come first served, while budget is left and a
  KV slot can be had: a free slot (never used, or reset) first, else the least recently used
  parked slot is evicted, sparing the slot that holds the new request's prefix when another
  one is parked. An admitted request gets its first chunk in the same step.
- **Prefix cache.** A prompt is cut into full blocks (``block_size`` tokens, 16 by default)
  with chained hashes (``block_hashes``); only full blocks are reused, and never the last
  prompt token (it is recomputed to get the logits of the first output token), so a prompt
  that is entirely cached reuses one block less. A prompt's blocks become matchable when its
  prefill completes (two prompts prefilling side by side do not share). The executor copies
  the reused tokens from ``Admission.source`` into the new slot (``model.copy_prefix(src,
  dst, n)``); when the source is the slot being taken (the only one left), the first
  ``reused`` tokens are kept in place.
- **Finish.** A request that finishes ok parks its slot with its KV kept (its blocks stay
  matchable) until the slot is needed again; a failed request's slot is reset and its
  blocks evicted. Without a prefix cache every finished slot is reset and freed.
  ``on_finished`` returns the slot the executor must reset (``model.reset``), or None.
- **Prefix-source recency.** A parked slot whose prefix was just copied moves to the back of
  the eviction line (most recently used).

Example: two slots, a 64-token budget; request 0 (40 tokens, 2 full blocks) runs and
finishes; request 1 shares its first 36 tokens, so it reuses 2 blocks = 32 tokens from slot 0.

>>> s = Scheduler(n_slots=2, budget=64)
>>> s.add(0, list(range(40)), output_tokens=2)
>>> p = s.plan()
>>> p.admit
(Admission(id=0, slot=0, reused=0, source=None, evicted=False),)
>>> p.prefill
(Chunk(id=0, tokens=40, start=0, final=True),)
>>> s.on_prefilled(0, 40)       # the chunk ran: the prompt is complete, its 2 blocks matchable
True
>>> s.on_token_delivered(0)     # the first output token (picked from the prefill's logits)
False
>>> s.plan().decode             # one decode token for request 0, nothing else to do
(0,)
>>> s.on_token_delivered(0)     # the second and last token: the executor finishes the request
True
>>> s.on_finished(0) is None    # finished ok: slot 0 is parked with its KV, nothing to reset
True
>>> s.parked
deque([0])
>>> s.add(1, list(range(36)) + [7] * 10, output_tokens=1)
>>> p = s.plan()
>>> p.admit                     # free slot 1; 32 tokens copied from parked slot 0
(Admission(id=1, slot=1, reused=32, source=0, evicted=False),)
>>> p.prefill                   # the other 14 tokens are prefilled
(Chunk(id=1, tokens=14, start=32, final=True),)
"""

from __future__ import annotations

import hashlib
import math
from collections import deque
from dataclasses import dataclass
from typing import NamedTuple

BLOCK_SIZE = 16


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
class Request:
    """The scheduler's view of one request: sizes and progress, no text and no timestamps."""

    id: int
    prompt_len: int
    output_tokens: int
    hashes: tuple = ()          # chained hashes of the prompt's full blocks
    slot: int = -1              # KV slot once admitted
    done: int = 0               # prompt tokens in the KV cache (reused + prefilled)
    cached: int = 0             # prompt tokens reused from the prefix cache
    generated: int = 0          # output tokens delivered

    @property
    def prefilled(self) -> bool:
        return self.done >= self.prompt_len


class Admission(NamedTuple):
    """A queued request gets ``slot``. The executor resets the slot, then copies ``reused``
    prefix tokens from slot ``source`` into it; when ``source == slot`` (``in_place``) it
    keeps the slot's first ``reused`` tokens instead of resetting. ``evicted``: the slot was
    taken from the parked ones (its old KV and blocks dropped)."""

    id: int
    slot: int
    reused: int = 0
    source: int | None = None
    evicted: bool = False

    @property
    def in_place(self) -> bool:
        return self.reused > 0 and self.source == self.slot


class Chunk(NamedTuple):
    """Prefill ``tokens`` prompt tokens of request ``id`` from position ``start``; ``final``: the
    prompt's last chunk (its logits pick the first output token)."""

    id: int
    tokens: int
    start: int
    final: bool


@dataclass(frozen=True)
class StepPlan:
    """One step, run in this order: admissions (slot set-up), the decode batch, the chunks."""

    decode: tuple = ()          # request ids decoding one token each, in batch order
    admit: tuple = ()           # Admission, in order
    prefill: tuple = ()         # Chunk, in order: started prompts first, then the admitted ones

    @property
    def prefill_tokens(self) -> int:
        return sum(c.tokens for c in self.prefill)

    @property
    def tokens(self) -> int:
        """Tokens this step spends against the budget."""
        return len(self.decode) + self.prefill_tokens

    @property
    def empty(self) -> bool:
        return not self.decode and not self.prefill


class Scheduler:
    """Continuous batching with chunked prefill and a prefix cache; see the module docstring.

    State (read it freely, change it only through the methods): ``waiting`` (deque of
    ``Request``, queue order), ``running`` (list, running order), ``free`` (deque of slots),
    ``parked`` (deque of slots, least recently used first), ``cache`` (``PrefixCache`` or None),
    ``requests`` (id -> ``Request``, every request added and not yet finished). ``budget`` may
    be changed between steps.
    """

    def __init__(self, n_slots: int, *, budget: int | None = None, prefix_cache: bool = True,
                 block_size: int = BLOCK_SIZE):
        if budget is not None and budget < 1:
            raise ValueError("the chunk budget must be at least one token per step.")
        if n_slots < 1:
            raise ValueError("the scheduler needs at least one KV slot.")
        self.n_slots, self.budget, self.block = n_slots, budget, block_size
        self.cache = PrefixCache(block_size) if prefix_cache else None
        self.free = deque(range(n_slots))   # never used or reset
        self.parked = deque()               # finished ok, KV kept for prefix reuse (LRU first)
        self.waiting = deque()
        self.running: list = []
        self.requests: dict = {}

    @property
    def busy(self) -> bool:
        """Requests are waiting or running."""
        return bool(self.waiting or self.running)

    def add(self, id: int, ids, output_tokens: int) -> None:  # noqa: A002 - a request id
        """Queue a request that has arrived: ``ids`` are its prompt's token ids."""
        if id in self.requests:
            raise ValueError(f"request {id} is already scheduled.")
        r = Request(id, len(ids), output_tokens, tuple(block_hashes(ids, self.block)))
        self.requests[id] = r
        self.waiting.append(r)

    # ---- planning
    def plan(self) -> StepPlan:
        """The next step under the budget. Admissions take effect now (slots assigned, the
        round-robin order advanced); progress moves only when the executor reports it."""
        left = math.inf if self.budget is None else self.budget
        ready = [r for r in self.running if r.prefilled]
        decoders = ready[: int(min(left, self.n_slots))]
        left -= len(decoders)
        if len(decoders) < len(ready):      # budget below the batch: round robin
            for r in decoders:
                self.running.remove(r)
                self.running.append(r)
        chunks, admits = [], []
        for r in [r for r in self.running if not r.prefilled]:
            if left <= 0:
                break
            n = int(min(r.prompt_len - r.done, left))
            chunks.append(Chunk(r.id, n, r.done, r.done + n >= r.prompt_len))
            left -= n
        while left > 0 and self.waiting and (self.free or self.parked):
            r = self.waiting.popleft()
            admits.append(self._admit(r))
            n = int(min(r.prompt_len - r.done, left))
            chunks.append(Chunk(r.id, n, r.done, r.done + n >= r.prompt_len))
            left -= n
        return StepPlan(tuple(r.id for r in decoders), tuple(admits), tuple(chunks))

    def _take_slot(self, keep) -> tuple:
        """(slot, evicted): a free slot, else the least recently used parked one, sparing ``keep``."""
        if self.free:
            return self.free.popleft(), False
        victims = [s for s in self.parked if s != keep] or list(self.parked)
        s = victims[0]
        self.parked.remove(s)
        self.cache.evict(s)
        return s, True

    def _admit(self, r: Request) -> Admission:
        src, n = self.cache.match(r.hashes, r.prompt_len) if self.cache is not None else (None, 0)
        r.slot, evicted = self._take_slot(src)
        if n and src != r.slot and src in self.parked:   # just used: last in line for eviction
            self.parked.remove(src)
            self.parked.append(src)
        r.done = r.cached = n
        self.running.append(r)
        return Admission(r.id, r.slot, n, src if n else None, evicted)

    # ---- what the executor reports
    def on_prefilled(self, id: int, n: int) -> bool:  # noqa: A002
        """A chunk of ``n`` tokens ran. True when the prompt is complete (its blocks become
        matchable; the executor picks the first output token)."""
        r = self.requests[id]
        r.done += n
        if r.prefilled and self.cache is not None:
            self.cache.register(r.hashes, r.slot)
        return r.prefilled

    def on_token_delivered(self, id: int) -> bool:  # noqa: A002
        """An output token was delivered. True when it was the last one: call ``on_finished``."""
        r = self.requests[id]
        r.generated += 1
        return r.generated >= r.output_tokens

    def on_finished(self, id: int, *, failed: bool = False) -> int | None:  # noqa: A002
        """The request is done (ok, or ``failed``); returns the slot the executor must reset
        (``model.reset``), or None when the slot is parked with its KV (or it had none)."""
        r = self.requests.pop(id)
        if r in self.running:
            self.running.remove(r)
        if r in self.waiting:
            self.waiting.remove(r)
        if r.slot < 0:
            return None
        if not failed and self.cache is not None:
            self.parked.append(r.slot)
            return None
        if self.cache is not None:
            self.cache.evict(r.slot)
        self.free.append(r.slot)
        return r.slot
