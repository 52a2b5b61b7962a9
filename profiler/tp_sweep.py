"""A tensor-parallel sweep: every rank times its shard of every op, and the step's collectives, in lockstep.

``tp_sweep(ctx, plan, writer)`` runs on every rank (``writer`` only on rank 0) and walks the same grid as
``profiler.sweep.run_sweep``, with the same rules:

* every (weight dtype, KV dtype) variant of the plan runs as one pass over the grid (quantized weights are
  quantized whole on every rank, then sharded: ``kernels.tp``);
* rank 0 decides what remains (a point is done when every rank's line for it is in the file, so
  ``--resume`` continues a run that stopped between two ranks' lines) and broadcasts it, so every
  rank builds the same runners (``kernels.runners.make_runners(..., tp=...)``) in the same order;
* an out-of-memory error while building on any rank skips the point on every rank (the step cannot
  run without it); one while timing skips that rank's line only;
* under expert parallelism (``ep`` = the ranks) each rank holds E / N whole experts
  (``kernels.runners.make_runners(..., tp=TPGroup(ep=N))``): its experts op costs its own load, and the step's
  collectives are the phase's own (``roofline.parallel.step_collectives``: the dispatch / combine all-to-alls
  instead of the MoE layers' MLP all-reduce); every point records ``ep``;
* local ops are timed as on one device (``profiler.timing.measure``); a collective is timed with
  the repetition count agreed over the ranks and a barrier before each repetition (the collectives
  must meet), flagged "communication" with its message and wire bytes;
* after each op, every rank's ``Measurement`` (``rank`` set) goes to rank 0, which writes them in
  rank order, each flushed as it is written: a run that stops keeps every finished point.

On a CPU the other ranks share the machine by design: no "host-busy" retry or flag here (the
single-device sweep's probe would see its own peers as other processes).
"""

from __future__ import annotations

from dataclasses import replace

from roofline.records import Measurement

from .sweep import expected_ops, SweepStats, _backend_flags, _default_make_runners, _free_memory, _short, \
    formula_cost, is_oom, point_for
from .timing import measure, now

COMM_MIN_REPS = 20   # collectives: gloo's wake-ups are bimodal on small VMs (0.3 ms / 4 ms); 5 samples are not enough


def tp_op_names(plan, tp: int = 2, ep: int = 1) -> tuple:
    """What a TP sweep times per point: the plan's ops (default: every op and the layer) then the step's own
    collectives over ``tp`` ranks with ``ep`` (``roofline.parallel.step_collectives``: under --ep the all-to-alls
    replace the MoE layers' MLP all-reduce; their names do not depend on the batch or the context)."""
    from roofline.parallel import shard, step_collectives

    if plan.ops:
        return tuple(plan.ops)
    coll = step_collectives(plan.model, shard(plan.model, tp, ep), 1, (1,), plan.dtype)
    return expected_ops(plan.model) + tuple(c.name for c in coll)


def _done_pairs(writer) -> set:
    """(point key, rank) of every line already in the file (rank 0 only)."""
    if writer is None or writer.old is None:
        return set()
    return {(m.point.key, m.rank) for m in writer.old.measurements}


def tp_sweep(ctx, plan, writer=None, *, make_runners=None, progress=None, device_name: str = "",
             ep: int = 1) -> SweepStats:
    """Measure every op of ``plan`` on every rank (see the module docstring), experts over ``ep`` ranks (1, or the
    world); rank 0 writes, and returns the counts."""
    make_runners = make_runners or _default_make_runners()
    progress = progress or (lambda n, d: None)
    stats, t_start = SweepStats(), now()
    lead = ctx.rank == 0
    have = _done_pairs(writer) if lead else set()
    names = tp_op_names(plan, ctx.world, ep)
    group = replace(ctx.tp, ep=ep)
    pkw = {"tp": ctx.world, "ep": ep}
    for (wdt, kvdt), (phase, backend, batch, context) in ((v, c) for v in plan.variants() for c in plan.combos()):
        q = {} if (wdt, kvdt) == (plan.dtype, plan.dtype) else {"weight_dtype": wdt, "kv_dtype": kvdt}
        label = f"{phase} {backend} b={batch} ctx={context} tp{ctx.world}" + (f" ep{ep}" if ep > 1 else "") + "".join(
            f" {k[0]}:{v}" for k, v in (("w", wdt), ("kv", kvdt)) if q and v != plan.dtype)
        todo = None
        if lead:
            from roofline.cost import ZERO

            keys = {n: point_for(plan, n, phase, backend, batch, context, ZERO, **pkw, **q).key for n in names}
            todo = [n for n in names if not all((keys[n], r) in have for r in range(ctx.world))]
            stats.resumed += len(names) - len(todo)
            progress(len(names) - len(todo), label)
        todo = ctx.bcast(todo)
        if not todo:
            continue
        err = None
        try:
            qkw = dict(q, group_size=plan.group_size, zero_point=plan.zero_point) if q else {}
            runners = make_runners(plan.model, phase, batch, context, dtype=plan.dtype, backend=backend,
                                   device=ctx.device, seed=0, ops=list(todo), tp=group, **qkw)
        except Exception as e:  # noqa: BLE001 - only OOM is survivable; anything else is re-raised
            if not is_oom(e):
                raise
            runners, err = [], f"out of memory while allocating inputs on rank {ctx.rank}: {_short(e)}"
            _free_memory(ctx.device, after_oom=True)
        errs = [e for e in (ctx.gather(err) or []) if e]
        verdict = ctx.bcast(errs[0] if errs else None)
        if verdict:
            if lead:
                for n in todo:
                    cost, cdt = formula_cost(plan, n, phase, batch, context, **pkw, **q)
                    point = point_for(plan, n, phase, backend, batch, context, cost, cdt, **pkw, **q)
                    for r in range(ctx.world):
                        _write(writer, stats, Measurement(point=point, status="skipped", reason=verdict,
                                                          device=device_name, timer=_timer(ctx), rank=r))
                progress(len(todo), label)
            del runners
            continue
        for r in runners:
            point = point_for(plan, r.name, phase, backend, batch, context, r.cost, r.compute_dtype, **pkw, **q)
            m, spent = _time_one(ctx, plan, r, point, backend, device_name)
            stats.kernel_time_s += spent
            got = ctx.gather(m)
            if lead:
                for one in got:
                    _write(writer, stats, one)
                progress(1, label)
        del runners
        _free_memory(ctx.device)
    ctx.barrier()          # every rank has finished before rank 0 reads the file back
    stats.wall_s = now() - t_start
    return stats


def _timer(ctx) -> str:
    return "cuda-events" if ctx.device.startswith("cuda") else "cpu-clock"


def _write(writer, stats, m: Measurement) -> None:
    writer.write(m)
    if m.ok:
        stats.measured += 1
    else:
        stats.skipped += 1


def _time_one(ctx, plan, r, point, backend, device_name):
    """(this rank's Measurement of runner ``r``, seconds spent in timed samples)."""
    comm = "communication" in r.flags
    try:
        if comm:
            t = measure(r.fn, ctx.device, budget_s=plan.budget_s, warmup_s=plan.warmup_s, min_reps=COMM_MIN_REPS,
                        max_reps=500, agree=ctx.agree_max, between=ctx.barrier)
        else:
            t = measure(r.fn, ctx.device, budget_s=plan.budget_s, warmup_s=plan.warmup_s,
                        flush_bytes=plan.flush_bytes)
    except Exception as e:  # noqa: BLE001
        if comm or not is_oom(e):
            raise
        _free_memory(ctx.device, after_oom=True)
        return Measurement(point=point, status="skipped", reason=f"out of memory while running: {_short(e)}",
                           device=device_name, timer=_timer(ctx), rank=ctx.rank), 0.0
    m = Measurement(point=point, times_s=t.times_s, timer=t.timer, l2_policy=t.l2_policy,
                    config={**dict(r.config), **t.config, "rank_device": ctx.device}, device=device_name,
                    flags=tuple(r.flags) + _backend_flags(replace(plan, device=ctx.device), backend), rank=ctx.rank)
    return m, sum(t.times_s)
