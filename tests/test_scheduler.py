"""The serving loop's scheduling (profiler/scheduler.py), planned step by step with no model and no torch.

Each test plays the executor by hand: it asks for a plan, then reports what "ran"
(``on_prefilled``, ``on_token_delivered``, ``on_finished``), and asserts the exact plans.
"""

import doctest
import random
import subprocess
import sys
from collections import deque

import pytest

import profiler.scheduler as scheduler
from profiler.scheduler import Admission, Chunk, PrefixCache, Scheduler, StepPlan, block_hashes


def prompt(n, base):
    """n distinct token ids (prompts with different bases share nothing)."""
    return [base * 1000 + i for i in range(n)]


def report(s, plan):
    """Run ``plan`` as an executor would: every chunk and decode succeeds; finished requests finish ok.
    Returns the ids that finished."""
    finished = []
    for rid in plan.decode:
        if s.on_token_delivered(rid):
            finished.append(rid)
    for c in plan.prefill:
        if s.on_prefilled(c.id, c.tokens) and s.on_token_delivered(c.id):
            finished.append(c.id)
    for rid in finished:
        s.on_finished(rid)
    return finished


def run_to_end(s, rid_prompt_out):
    """Add requests and step until they all finished ok (no budget limit needed)."""
    for rid, ids, out in rid_prompt_out:
        s.add(rid, ids, out)
    while s.busy:
        report(s, s.plan())


# ---- (a) the budget: decode tokens first, then a chunk of what is left

def test_budget_64_two_decoders_and_a_200_token_prompt():
    s = Scheduler(4, budget=64)
    s.add(0, prompt(10, 1), 100)
    s.add(1, prompt(10, 2), 100)
    p = s.plan()
    assert p == StepPlan(decode=(), admit=(Admission(0, 0), Admission(1, 1)),
                         prefill=(Chunk(0, 10, 0, True), Chunk(1, 10, 0, True)))
    report(s, p)
    s.add(2, prompt(200, 3), 5)
    p = s.plan()
    assert p.decode == (0, 1)
    assert p.admit == (Admission(id=2, slot=2, reused=0, source=None, evicted=False),)
    assert p.prefill == (Chunk(id=2, tokens=62, start=0, final=False),)
    assert p.tokens == 64 and p.prefill_tokens == 62
    chunks = [p.prefill]
    report(s, p)
    while not s.requests[2].prefilled:
        p = s.plan()
        assert p.decode == (0, 1) and p.admit == () and p.tokens <= 64
        chunks.append(p.prefill)
        report(s, p)
    assert chunks == [(Chunk(2, 62, 0, False),), (Chunk(2, 62, 62, False),), (Chunk(2, 62, 124, False),),
                      (Chunk(2, 14, 186, True),)]             # 200 = 3 x 62 + 14
    assert s.plan().decode == (0, 1, 2)                       # prefilled: request 2 decodes too


def test_started_prompts_are_chunked_before_new_admissions():
    s = Scheduler(4, budget=32)
    s.add(0, prompt(50, 1), 3)
    s.add(1, prompt(50, 2), 3)
    p = s.plan()                       # request 0's first chunk takes the whole budget: 1 waits
    assert p.admit == (Admission(0, 0),) and p.prefill == (Chunk(0, 32, 0, False),)
    assert [r.id for r in s.waiting] == [1]
    report(s, p)
    p = s.plan()                       # 18 left of request 0, then 1 is admitted with the other 14
    assert p.admit == (Admission(1, 1),) and p.prefill == (Chunk(0, 18, 32, True), Chunk(1, 14, 0, False))


# ---- (b) the budget below the decode batch: round robin

def test_budget_below_the_decode_batch_round_robins():
    s = Scheduler(4, budget=None)
    for i in range(3):
        s.add(i, prompt(5, i + 1), 100)
    report(s, s.plan())
    s.budget = 2
    seen = []
    for _ in range(3):
        p = s.plan()
        assert p.prefill == () and p.admit == () and p.tokens == 2
        seen.append(p.decode)
        report(s, p)
    assert seen == [(0, 1), (2, 0), (1, 2)]
    s.budget = 3                       # the whole batch fits: no rotation
    assert [s.plan().decode for _ in range(2)] == [(0, 1, 2), (0, 1, 2)]


# ---- (c) no budget: a prompt is prefilled whole

def test_no_budget_prefills_a_whole_prompt_in_one_chunk():
    s = Scheduler(2, budget=None)
    s.add(0, prompt(8, 1), 10)
    report(s, s.plan())
    s.add(1, prompt(500, 2), 10)
    p = s.plan()
    assert p == StepPlan(decode=(0,), admit=(Admission(1, 1),), prefill=(Chunk(1, 500, 0, True),))


def test_bad_budget_and_no_slots_are_refused():
    with pytest.raises(ValueError, match="at least one token per step"):
        Scheduler(2, budget=0)
    with pytest.raises(ValueError, match="at least one KV slot"):
        Scheduler(0)
    s = Scheduler(1)
    s.add(0, [1, 2], 1)
    with pytest.raises(ValueError, match="already scheduled"):
        s.add(0, [1, 2], 1)


# ---- (d) the prefix cache

def test_prefix_reuse_of_three_full_blocks_from_a_parked_slot():
    s = Scheduler(2, budget=None)
    a = prompt(60, 1)                                   # 3 full blocks of 16 + 12
    run_to_end(s, [(0, a, 1)])
    assert s.parked == deque([0]) and s.free == deque([1])
    s.add(1, a[:48] + prompt(20, 2), 1)                 # shares exactly 3 full blocks
    p = s.plan()
    assert p.admit == (Admission(id=1, slot=1, reused=48, source=0, evicted=False),)
    assert p.prefill == (Chunk(1, 20, 48, True),)       # only the rest is prefilled
    assert s.requests[1].cached == 48


def test_a_fully_cached_prompt_recomputes_its_last_block():
    s = Scheduler(2, budget=None)
    a = prompt(60, 1)
    run_to_end(s, [(0, a, 1)])
    s.add(1, a[:48], 1)                                 # the shared part is the whole prompt
    p = s.plan()
    assert p.admit == (Admission(1, 1, reused=32, source=0),)   # one block less: the last token is recomputed
    assert p.prefill == (Chunk(1, 16, 32, True),)
    s.add(2, a[:49], 1)                                 # one token more: all 3 blocks reusable
    report(s, p)
    p = s.plan()
    assert p.admit[0].reused == 48 and p.prefill == (Chunk(2, 1, 48, True),)


def test_blocks_become_matchable_only_when_the_prefill_completes():
    s = Scheduler(3, budget=40)
    a = prompt(64, 1)
    s.add(0, a, 1)
    p = s.plan()
    assert p.prefill == (Chunk(0, 40, 0, False),)
    report(s, p)
    s.add(1, list(a), 1)                 # same prompt while request 0 is still prefilling: no reuse
    p = s.plan()
    assert p.admit == (Admission(1, 1),) and p.prefill == (Chunk(0, 24, 40, True), Chunk(1, 16, 0, False))
    report(s, p)                         # request 0's prompt completes: its 4 blocks register
    s.add(2, list(a), 1)
    s.budget = None
    p = s.plan()
    assert p.admit == (Admission(2, 2, reused=48, source=0, evicted=False),)


def test_without_a_prefix_cache_nothing_is_reused_or_parked():
    s = Scheduler(2, budget=None, prefix_cache=False)
    a = prompt(60, 1)
    s.add(0, a, 1)
    assert s.plan().prefill == (Chunk(0, 60, 0, True),)
    assert s.on_prefilled(0, 60) and s.on_token_delivered(0)
    assert s.on_finished(0) == 0                        # ok, but reset: no KV kept
    assert s.cache is None and s.parked == deque() and s.free == deque([1, 0])
    s.add(1, list(a), 1)
    assert s.plan().admit == (Admission(1, 1),)


# ---- (e) slots: waiting, LRU eviction sparing the prefix source

def test_all_slots_busy_the_request_waits_then_takes_an_evicted_parked_slot():
    s = Scheduler(2, budget=None)
    s.add(0, prompt(20, 1), 5)
    s.add(1, prompt(20, 2), 2)
    report(s, s.plan())
    s.add(2, prompt(20, 3), 1)
    p = s.plan()
    assert p == StepPlan(decode=(0, 1))                 # no slot: request 2 waits
    assert [r.id for r in s.waiting] == [2] and s.requests[2].slot == -1
    assert report(s, p) == [1]                          # request 1 has its 2 tokens: slot 1 parked
    assert s.parked == deque([1]) and not s.free
    p = s.plan()
    assert p.decode == (0,) and p.admit == (Admission(2, 1, evicted=True),) and p.prefill == (Chunk(2, 20, 0, True),)
    assert s.parked == deque() and not s.waiting


def test_lru_eviction_spares_the_prefix_source():
    s = Scheduler(3, budget=None)
    prompts = {i: prompt(40, i + 1) for i in range(3)}
    run_to_end(s, [(i, prompts[i], 1) for i in range(3)])   # finish in order: 0, 1, 2
    assert s.parked == deque([0, 1, 2]) and not s.free
    s.add(3, prompts[0][:32] + prompt(10, 9), 1)          # its prefix is in slot 0, the LRU one
    p = s.plan()
    assert p.admit == (Admission(id=3, slot=1, reused=32, source=0, evicted=True),)   # slot 1 goes instead
    assert s.parked == deque([2, 0])                       # slot 0 just used: last in line
    assert s.cache.match(block_hashes(prompts[1]), 40) == (None, 0)       # slot 1's blocks are gone
    assert s.cache.match(block_hashes(prompts[0]), 40) == (0, 32)
    report(s, p)
    s.add(4, prompt(40, 8), 1)                            # no prefix: plain LRU
    assert s.plan().admit == (Admission(4, 2, evicted=True),)
    assert s.parked == deque([0, 1])


def test_the_only_parked_slot_keeps_its_prefix_in_place():
    s = Scheduler(1, budget=64)
    a = prompt(50, 1)
    run_to_end(s, [(0, a, 2)])
    s.add(1, a[:40] + prompt(10, 2), 2)                   # 40 shared: 2 full blocks
    p = s.plan()
    (adm,) = p.admit
    assert adm == Admission(1, 0, reused=32, source=0, evicted=True) and adm.in_place
    assert p.prefill == (Chunk(1, 18, 32, True),)


# ---- (f) failures

def test_a_failed_request_is_reset_and_its_blocks_evicted():
    s = Scheduler(2, budget=None)
    a = prompt(40, 1)
    s.add(0, a, 5)
    report(s, s.plan())
    assert s.cache.match(block_hashes(a), 40) == (0, 32)    # prefilled: matchable
    assert s.on_finished(0, failed=True) == 0               # e.g. its decode raised: reset slot 0
    assert s.cache.table == {} and s.parked == deque() and s.free == deque([1, 0])
    assert s.requests == {} and s.running == [] and not s.busy
    s.add(1, list(a), 1)
    assert s.plan().admit == (Admission(1, 1),)             # nothing to reuse; free slot 1 first


def test_a_prefill_failure_frees_the_slot_for_the_next_request():
    s = Scheduler(1, budget=16)
    s.add(0, prompt(40, 1), 2)
    s.add(1, prompt(20, 2), 2)
    p = s.plan()
    assert p.prefill == (Chunk(0, 16, 0, False),)
    assert s.on_finished(0, failed=True) == 0               # the chunk raised
    p = s.plan()
    assert p.admit == (Admission(1, 0),) and p.prefill == (Chunk(1, 16, 0, False),)


# ---- invariants over random runs, and the module's own example

def test_random_runs_keep_the_invariants():
    rng = random.Random(3)
    for _ in range(200):
        n_slots, budget = rng.randint(1, 4), rng.choice([None, 1, 2, 5, 16, 64])
        s = Scheduler(n_slots, budget=budget, prefix_cache=rng.random() < 0.8)
        base = prompt(80, 1)
        todo = [(i, base[:rng.randint(0, 60)] + prompt(rng.randint(1, 40), i + 2), rng.randint(1, 4))
                for i in range(rng.randint(1, 8))]
        n, finished = len(todo), []
        for _ in range(10_000):
            if todo and rng.random() < 0.4:
                s.add(*todo.pop(0))
            if not s.busy:
                if not todo:
                    break
                continue
            p = s.plan()
            assert budget is None or p.tokens <= budget
            assert not p.empty
            slots = [r.slot for r in s.running]
            assert len(set(slots)) == len(slots) and -1 not in slots
            assert sorted(slots + list(s.free) + list(s.parked)) == list(range(n_slots))
            for c in p.prefill:
                r = s.requests[c.id]
                assert c.start == r.done and 0 < c.tokens <= r.prompt_len - r.done
            if rng.random() < 0.05 and s.running:           # something fails
                rid = rng.choice(s.running).id
                finished.append(rid)
                s.on_finished(rid, failed=True)
                continue
            finished += report(s, p)
        assert not todo and not s.busy and sorted(finished) == list(range(n))


def test_the_module_example_runs():
    assert doctest.testmod(scheduler).failed == 0


def test_the_scheduler_is_pure_and_serving_reexports_it():
    code = "import sys, profiler.scheduler; assert 'torch' not in sys.modules and 'numpy' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
    from profiler import serving
    assert serving.PrefixCache is PrefixCache and serving.block_hashes is block_hashes
    assert serving.BLOCK_SIZE == scheduler.BLOCK_SIZE == 16
