"""The continuous-batching loop (profiler/serving.py) on a fake model with a fake step clock.

The fake has LlamaModel's serving API and advances a FakeClock by a fixed cost per call,
so timings here are exact and the chunk-budget trade-off is deterministic.
"""

import math
from types import SimpleNamespace

import pytest
import torch

from profiler.serving import BLOCK_SIZE, FakeClock, PrefixCache, RequestSpec, block_hashes, serve
from profiler.tokenizer import ByteTokenizer, make_prompt
from roofline.latency import summarize

PREFILL_FIXED, PREFILL_PER_TOKEN, DECODE_STEP = 0.002, 0.001, 0.010   # seconds


class FakeModel:
    def __init__(self, clock, vocab=300, max_slots=4, max_len=2048, fail_prefill_slot_len=None, fail_decode=False):
        self.cfg = SimpleNamespace(vocab=vocab)
        self.clock, self.max_len, self.device = clock, max_len, "cpu"
        self.lengths = torch.zeros(max_slots, dtype=torch.long)
        self.content = [[] for _ in range(max_slots)]   # what each slot's KV cache holds
        self.calls = []
        self.fail_prefill_slot_len, self.fail_decode = fail_prefill_slot_len, fail_decode

    def _logits(self, seq):
        out = torch.zeros(self.cfg.vocab)
        out[(sum(seq) * 31 + len(seq)) % self.cfg.vocab] = 1.0
        return out

    def prefill(self, tokens, slot, logits=True):
        toks = tokens.tolist()
        if self.fail_prefill_slot_len is not None and len(toks) + int(self.lengths[slot]) == self.fail_prefill_slot_len:
            raise RuntimeError("injected prefill failure")
        assert int(self.lengths[slot]) + len(toks) <= self.max_len
        self.calls.append(("prefill", slot, len(toks)))
        self.clock.advance(PREFILL_FIXED + PREFILL_PER_TOKEN * len(toks))
        self.content[slot] += toks
        self.lengths[slot] += len(toks)
        return self._logits(self.content[slot]) if logits else None

    def decode_step(self, tokens, slots):
        if self.fail_decode:
            raise RuntimeError("injected decode failure")
        self.calls.append(("decode", len(slots)))
        self.clock.advance(DECODE_STEP)
        rows = []
        for t, s in zip(tokens.tolist(), slots.tolist()):
            self.content[s].append(t)
            self.lengths[s] += 1
            rows.append(self._logits(self.content[s]))
        return torch.stack(rows)

    def copy_prefix(self, src, dst, n):
        assert int(self.lengths[src]) >= n
        self.calls.append(("copy", src, dst, n))
        self.content[dst] = self.content[src][:n]
        self.lengths[dst] = n

    def reset(self, slot):
        self.content[slot] = []
        self.lengths[slot] = 0

    @staticmethod
    def greedy(logits):
        return logits.argmax(-1)


def specs(prompts_outputs, arrivals=None, shared=0):
    arrivals = arrivals or [0.0] * len(prompts_outputs)
    return [RequestSpec(i, a, make_prompt(p, seed=i, shared_prefix=shared), o)
            for i, ((p, o), a) in enumerate(zip(prompts_outputs, arrivals))]


def ordered(t):
    seq = [t.arrival, *t.tokenize, *t.queue]
    for s, e, _ in t.chunks:
        seq += [s, e]
    seq += [t.first_selected, *t.deliveries, t.finish]
    return all(b >= a for a, b in zip(seq, seq[1:]))


def test_token_budget_respected_and_long_prompt_chunked():
    clock = FakeClock()
    m = FakeModel(clock)
    run = serve(m, specs([(100, 3)]), chunk_budget=32, clock=clock)
    (t,) = run.timelines
    assert [c[2] for c in t.chunks] == [32, 32, 32, 4]       # 100 = 3 x 32 + 4
    assert all(s["decode"] + s["prefill"] <= 32 for s in run.steps)
    assert t.n == 3 and ordered(t)
    # exact arithmetic of the fake: four chunks cost 4 x 2 ms + 100 x 1 ms = 108 ms, then 2 decode steps
    assert t.ttft == pytest.approx(0.108)
    assert t.itls == pytest.approx([0.010, 0.010])
    assert m.content[0][:100] == ByteTokenizer.to_model(ByteTokenizer().encode(make_prompt(100, seed=0)), 300)


def test_decode_interleaves_with_chunks_of_a_later_prompt():
    clock = FakeClock()
    m = FakeModel(clock)
    run = serve(m, specs([(8, 30), (200, 2)], arrivals=[0.0, 0.05]), chunk_budget=24, clock=clock)
    a, b = run.timelines
    mixed = [s for s in run.steps if s["decode"] and s["prefill"]]
    assert mixed and all(s["decode"] + s["prefill"] <= 24 for s in run.steps)
    first, last = b.chunks[0][0], b.chunks[-1][1]
    during = [d for d in a.deliveries if first < d < last]
    assert len(during) >= len(b.chunks) - 1                   # A keeps streaming while B prefills
    assert [c[2] for c in b.chunks][:2] == [23, 23]           # 24 - one decode token for A
    assert ordered(a) and ordered(b)


def test_prefix_cache_reuses_full_blocks_only_and_recomputes_last_token():
    cache = PrefixCache(16)
    ids = list(range(40))
    cache.register(block_hashes(ids), slot=3)                # 40 tokens: 2 full blocks registered
    assert len(block_hashes(ids)) == 2
    assert cache.match(block_hashes(ids[:40]), 40) == (3, 32)
    assert cache.match(block_hashes(ids[:32]), 32) == (3, 16)  # identical 32: last token recomputed
    assert cache.match(block_hashes([99] + ids[1:40]), 40) == (None, 0)  # chained: first block differs
    other = ids[:16] + [7] * 24
    assert cache.match(block_hashes(other), 40) == (3, 16)


def test_prefix_reuse_in_the_loop_lowers_prefilled_tokens_and_ttft():
    reqs = specs([(100, 4)] * 3, arrivals=[0.0, 1.0, 2.0], shared=70)   # 70 shared: 4 full blocks = 64
    runs = {}
    for on in (False, True):
        clock = FakeClock()
        m = FakeModel(clock)
        runs[on] = (serve(m, reqs, chunk_budget=512, prefix_cache=on, clock=clock), m)
    off, on = runs[False][0].timelines, runs[True][0].timelines
    assert [t.cached_tokens for t in on] == [0, 64, 64] and [t.prefilled_tokens for t in on] == [100, 36, 36]
    assert all(t.cached_tokens == 0 and t.prefilled_tokens == 100 for t in off)
    # TTFT: 2 + 100 ms without reuse; 2 + 36 ms with it. TPOT unchanged (10 ms).
    assert [t.ttft for t in off] == pytest.approx([0.102] * 3)
    assert [t.ttft for t in on] == pytest.approx([0.102, 0.038, 0.038])
    assert [t.tpot for t in on] == pytest.approx([t.tpot for t in off])
    m = runs[True][1]
    assert ("copy", 0, 1, 64) in m.calls
    # the reused slot holds exactly the prompt: copied prefix + recomputed suffix
    tok = ByteTokenizer()
    assert m.content[1][:100] == tok.to_model(tok.encode(reqs[1].prompt), 300)


def test_chunk_budget_trades_ttft_against_stalls_deterministically():
    # three streams decode; a 512-token prompt lands at 50 ms
    work = [(8, 60)] * 3 + [(512, 2)]
    res = {}
    for budget in (16, 64, 256, None):
        clock = FakeClock()
        run = serve(FakeModel(clock), specs(work, arrivals=[0.0, 0.0, 0.0, 0.05]), chunk_budget=budget, clock=clock)
        long, streams = run.timelines[3], run.timelines[:3]
        res[budget] = (long.ttft, max(g for t in streams for g in t.itls))
    ttfts = [res[b][0] for b in (16, 64, 256, None)]
    stalls = [res[b][1] for b in (16, 64, 256, None)]
    assert ttfts == sorted(ttfts, reverse=True) and ttfts[0] > 1.5 * ttfts[-1]   # bigger budget: faster first token
    assert stalls == sorted(stalls) and stalls[-1] > 5 * stalls[0]            # ...and longer stalls
    # no chunking: one 512-token prefill freezes the streams: 10 ms decode + 2 + 512 ms prefill
    assert res[None][1] == pytest.approx(0.010 + 0.002 + 0.512)
    # budget 16: each step is 3 decode tokens + a 13-token chunk: 10 + 2 + 13 ms
    assert res[16][1] == pytest.approx(0.010 + 0.002 + 0.013)


def test_failed_requests_are_counted_not_dropped():
    clock = FakeClock()
    m = FakeModel(clock, max_len=120, fail_prefill_slot_len=50)
    run = serve(m, specs([(20, 3), (50, 3), (200, 3), (30, 3)]), chunk_budget=64, clock=clock)
    by_id = {t.id: t for t in run.timelines}
    assert len(run.timelines) == 4
    assert by_id[1].status == "failed" and "injected prefill failure" in by_id[1].error
    assert by_id[2].status == "failed" and "max_len" in by_id[2].error
    assert by_id[0].ok and by_id[3].ok
    s = summarize(run.timelines)
    assert s.requests == 4 and s.failed == 2 and s.ttft["n"] == 2


def test_decode_failure_fails_the_batch_and_run_ends():
    clock = FakeClock()
    run = serve(FakeModel(clock, fail_decode=True), specs([(10, 5), (10, 1)]), chunk_budget=64, clock=clock)
    by_id = {t.id: t for t in run.timelines}
    assert by_id[0].status == "failed" and "decode" in by_id[0].error and by_id[0].n == 1
    assert by_id[1].ok and by_id[1].n == 1 and math.isnan(by_id[1].tpot)   # one token: no decode step


def test_streaming_callback_sees_every_token_in_order():
    clock = FakeClock()
    seen = []
    run = serve(FakeModel(clock), specs([(10, 4), (12, 3)]), chunk_budget=8, clock=clock,
                on_token=lambda rid, tid, text: seen.append(rid))
    assert sorted(seen) == [0, 0, 0, 0, 1, 1, 1] and {t.id: t.n for t in run.timelines} == {0: 4, 1: 3}
    assert BLOCK_SIZE == 16


def test_single_slot_reuses_its_own_parked_prefix():
    clock = FakeClock()
    m = FakeModel(clock, max_slots=1)
    reqs = specs([(50, 2), (50, 2)], arrivals=[0.0, 1.0], shared=40)     # 40 shared: 2 full blocks
    a, b = serve(m, reqs, chunk_budget=64, clock=clock).timelines
    assert (a.cached_tokens, b.cached_tokens) == (0, 32) and b.prefilled_tokens == 18
    assert ("copy", 0, 0, 32) in m.calls
    tok = ByteTokenizer()
    assert m.content[0][:50] == tok.to_model(tok.encode(reqs[1].prompt), 300)


def test_real_model_streams_the_same_tokens_with_and_without_prefix_reuse():
    from kernels.model import LlamaModel
    from roofline.models import load_model

    m = LlamaModel(load_model("tiny"), dtype="fp32", backend="torch", max_slots=3, max_len=200, seed=1)
    reqs = [RequestSpec(i, 0.0, make_prompt(100, seed=i, shared_prefix=70), 12) for i in range(5)]
    streams, cached = {}, {}
    for on in (False, True):
        got = {}
        for s in range(3):
            m.reset(s)
        run = serve(m, reqs, chunk_budget=24, prefix_cache=on,
                    on_token=lambda rid, tid, text: got.setdefault(rid, []).append(tid))
        streams[on], cached[on] = got, [t.cached_tokens for t in run.timelines]
        assert all(t.ok and t.n == 12 and ordered(t) for t in run.timelines)
    # requests 0 and 1 prefill side by side (blocks register when a prompt completes); 2-4 reuse 64 = 4 blocks
    assert cached == {False: [0] * 5, True: [0, 0, 64, 64, 64]}
    assert streams[True] == streams[False]          # reused KV gives the same greedy tokens


def test_on_finish_gets_each_timeline_once_as_it_finishes_including_failures():
    clock = FakeClock()
    m = FakeModel(clock, max_len=120, fail_prefill_slot_len=50)
    calls = []
    run = serve(m, specs([(30, 6), (50, 3), (200, 3), (20, 1), (10, 2)], arrivals=[0.0, 0.0, 0.0, 0.0, 0.2]),
                chunk_budget=64, clock=clock, on_finish=lambda t: calls.append((clock.now(), t)))
    assert sorted(t.id for _, t in calls) == [0, 1, 2, 3, 4]                 # once per request
    finishes = [t.finish for _, t in calls]
    assert finishes == sorted(finishes)                                      # in finish order...
    assert [t.id for _, t in calls] != [t.id for t in run.timelines]         # ...not in the run's order
    assert all(now == t.finish for now, t in calls)                          # called right as it finishes
    by_id = {t.id: t for t in run.timelines}
    assert all(t is by_id[t.id] and t == by_id[t.id] for _, t in calls)      # the returned objects, complete
    assert calls[0][1].id == 2 and "max_len" in calls[0][1].error and calls[0][1].n == 0   # failed at admission
    assert by_id[1].status == "failed" and "injected prefill failure" in by_id[1].error
    assert all(by_id[i].ok and by_id[i].n == by_id[i].output_tokens for i in (0, 3, 4))
