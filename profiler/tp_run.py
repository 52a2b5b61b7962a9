"""``roofline profile --tp N``: ``run_profile`` for N tensor-parallel ranks (``profiler.profile_run`` calls it).

The same run as on one device (``profiler.profile_run`` lists the stages), with the ranks around it:

1. every input is checked before anything starts: the plan, ``--tp`` against the model's heads
   (``roofline.parallel.shard``) and against this machine's GPUs (``profiler.distributed.check_tp``);
2. rank 0 (this process) opens the result file with the one writer, checks a resume, validates the
   kernels and measures its device's ceilings, as on one device;
3. the ranks start (``profiler.distributed.run_ranks``: torchrun's, or spawned here), measure the
   collectives (cached: ``profiler.collectives``) and their link goes into the header;
4. ``profiler.tp_sweep.tp_sweep`` times every rank's shard and the collectives; rank 0 writes each
   point as it finishes, one line per rank;
5. Ctrl-C raises ``Interrupted`` with the resume command; a rank that dies or stops answering ends
   the run with a one-line ``RooflineError`` (``RankLost``) saying which rank, how many points are
   kept and the command that resumes; every point measured before it is in the file.

With ``--ep N`` (= --tp N, ``validate_ep``) each rank holds E/N whole experts; the points and the header record
``ep`` and a resume must keep it (``check_resume_ep``).

On a CPU each rank gets ``cores / N`` threads (``--threads`` overrides), gloo over 127.0.0.1.
"""

from __future__ import annotations

import os
from dataclasses import replace

from roofline.errors import RooflineError
from roofline.records import read_results

from .profile_run import (ProfileResult, _finish_profile, _profile_header, check_folder, check_kernels,
                          check_plan, early_header, open_writer)
from .run import Interrupted, quiet, remove_derived
from .timing import cpu_threads, now


def rank_threads(run) -> int | None:
    """CPU threads per rank: --threads, else the cores shared out (a GPU rank needs no setting)."""
    if run.plan.device.startswith("cuda"):
        return None
    return run.threads or max(1, (os.cpu_count() or 1) // max(run.tp, 1))


def validate_tp(run, device_count: int | None = None) -> None:
    """One-line errors for ``--tp`` before anything starts (``device_count`` stands in for torch's, in tests):
    the ranks against this machine and the model's split (``roofline.parallel.shard``: heads, KV heads, MLP,
    expert and shared-expert widths). Dense models, mixtures of experts (every expert sliced, as vLLM's
    tensor-parallel MoE) and latent attention (heads split, latent replicated) all run sharded, with float,
    int8 or int4 weights (quantized whole, then sharded: ``kernels.tp``) and a float or 8-bit KV cache (each
    rank's KV heads with their scales). What cannot run: int4 groups that a rank's row-parallel shard would cut
    (``kernels.quant.check_tp_groups``); the plan's own checks (an 8-bit latent cache, fp8 without a GPU that
    has it) already ran. Expert parallelism (--ep) is checked by ``validate_ep``."""
    from kernels.quant import check_tp_groups
    from roofline.parallel import shard

    from .distributed import check_tp

    check_tp(run.tp, run.plan.device, device_count)
    shard(run.plan.model, run.tp, getattr(run, "ep", 1))
    if "int4" in run.plan.weight_dtypes:
        check_tp_groups(run.plan.model, run.tp, run.plan.group_size)


def validate_ep(model, tp: int, ep: int) -> None:
    """One-line errors for ``--ep`` before any rank starts: the expert-parallel ranks are the --tp ranks (give
    --tp N --ep N), the model must have routed experts and N must divide them (``roofline.parallel.shard``).
    A valid --ep runs: each rank its E/N whole experts (``kernels.tp.ep_experts``, ``kernels.runners`` with
    ``TPGroup(ep=N)``), every point and the header record ``ep``."""
    from roofline.parallel import shard

    if ep == 1:
        return
    if tp != ep:
        raise RooflineError(f"--ep {ep} with --tp {tp}: profile runs expert parallelism on the --tp ranks (attention "
                            f"tensor-parallel over the same ranks, as `roofline explain --ep` costs it), so give "
                            f"--tp {ep} --ep {ep}.")
    shard(model, tp, ep)             # a dense model, or experts N does not divide: one line naming the valid --ep


def check_resume_ep(run, writer) -> None:
    """A resume appends to a file of the same --ep only (a file without it, older than --ep, is ep 1)."""
    old = writer.old
    if old is None or old.header is None:
        return
    had = int(old.header.settings.get("ep", 1) or 1)
    if had != run.ep:
        raise RooflineError(f"cannot resume {run.path}: it was measured with --ep {had}, this run has --ep {run.ep}. "
                            f"Resume with --ep {had}, or write this run elsewhere (--out) or with --overwrite.")


def run_profile_tp(run, *, say=quiet, progress=None, make_runners=None) -> ProfileResult | None:
    """The tensor-parallel ``run_profile`` (module docstring); None on a follower rank under torchrun."""
    from .distributed import RankLost, run_ranks, torchrun_env

    plan = run.plan
    gpu = plan.device.startswith("cuda")
    check_plan(run)
    validate_ep(plan.model, run.tp, run.ep)
    validate_tp(run)
    threads = rank_threads(run)
    env = torchrun_env()
    if env is not None and env["rank"] != 0:      # a follower under torchrun: no file, no output
        run_ranks(run.tp, plan.device, None, _follow, (plan, run.quick, make_runners, run.ep), threads=threads)
        return None
    check_folder(run, say)
    writer = open_writer(run, say)
    try:
        check_resume_ep(run, writer)
    except RooflineError:
        writer.close()
        raise
    stages: dict = {}
    box: dict = {}
    try:
        with cpu_threads(threads) as n_threads:
            writer.check(early_header(run, n_threads))
            check_kernels(run, say, stages)
            from . import probes

            probe = probes.open_probe(plan.device)
            try:
                header = _profile_header(run, probe, n_threads, say, stages)
            finally:
                probe.close()
        say(f"starting {run.tp} ranks ({'nccl' if gpu else 'gloo'}"
            f"{', ' + str(threads) + ' threads each' if threads else ''}) ...")
        lead = _Lead(run, writer, header, say, progress, stages, box)
        run_ranks(run.tp, plan.device, lead, _follow, (plan, run.quick, make_runners, run.ep), threads=threads)
    except KeyboardInterrupt:
        writer.close()
        raise Interrupted(run.path, len(writer.done), run.command(resume=True)) from None
    except RankLost as e:
        writer.close()
        kept = _kept(run.path)
        raise RooflineError(f"{e}: {kept} measurements are kept in {run.path}; resume with: "
                            f"{run.command(resume=True)}") from None
    finally:
        writer.close()
    rf = read_results(run.path)
    result = ProfileResult(run.path, box.get("stats"), rf, stages, repaired_bytes=writer.repaired_bytes)
    _finish_profile(run, result, say)
    return result


def _kept(path) -> int:
    try:
        return sum(1 for m in read_results(path).measurements if m.ok)
    except RooflineError:
        return 0


class _Lead:
    """Rank 0's part, run inside the group: collectives' ceilings, the header, the sweep."""

    def __init__(self, run, writer, header, say, progress, stages, box):
        self.run, self.writer, self.header, self.say = run, writer, header, say
        self.progress, self.stages, self.box = progress, stages, box

    def __call__(self, ctx, plan, quick, make_runners, ep=1):
        from roofline.interconnect import Interconnect

        from .collectives import collective_ceilings
        from .tp_sweep import tp_sweep

        self.say("collectives: from the cache, or measured now ...")
        t = now()
        coll = collective_ceilings(ctx, self.header.device.name, quick=quick)
        self.stages["collectives"] = now() - t
        link = Interconnect.from_dict(coll["link"], "measured link")
        h = self.header
        settings = {**h.settings, "dist_backend": ctx.backend, "launcher": ctx.launcher, "world_size": ctx.world,
                    "threads_per_rank": h.settings.get("threads")}
        header = replace(h, device=h.device.with_link(link), settings=settings,
                         ceilings={**h.ceilings, "collective": coll})
        self.writer.begin(header)
        remove_derived(self.run.out)
        if self.writer.done:
            self.say(f"resuming: {len(self.writer.done)} points already in {self.run.path}")
        ctx.bcast("go")
        self.box["stats"] = s = tp_sweep(ctx, plan, self.writer, make_runners=make_runners, progress=self.progress,
                                         device_name=header.device.name, ep=ep)
        self.stages["sweep"] = s.wall_s
        return s


def _follow(ctx, plan, quick, make_runners, ep=1):
    """Ranks 1..N-1: the same steps as rank 0, in the same order; they write nothing."""
    from .collectives import collective_ceilings
    from .tp_sweep import tp_sweep

    collective_ceilings(ctx, "", quick=quick)
    ctx.bcast()
    tp_sweep(ctx, plan, None, make_runners=make_runners, ep=ep)
