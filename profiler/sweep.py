"""Sweeps: time every op of one transformer layer, the lm_head and the whole layer, over a grid.

A ``SweepPlan`` is the grid (phases x backends x batches x contexts for one model,
dtype and device); ``run_sweep`` walks it and writes one ``Measurement`` per op and
point through a ``ResultWriter``, flushed as each finishes:

* op callables come from ``kernels.runners.make_runners`` (injectable, so tests can
  pass a fake list); each ``OpRunner`` carries its formula ``Cost``.
* points already in the file (``writer.done``, from ``--resume``) are skipped, and a
  grid point whose ops are all done is not even built;
* an out-of-memory error while building or timing is recorded as ``status="skipped"``
  with the reason, and the sweep goes on;
* the device is probed before and after each op (``probes.point_flags``); an op
  disturbed by other processes ("host-busy") is timed once more, a throttled one flagged;
* KeyboardInterrupt propagates after the last finished line is on disk.
* speculative decoding (``spec``: draft counts k, ``roofline profile --spec 1,3,5``): phase "verify" times the
  verify step of k drafts at every (backend, batch, context) beside plain decode (``SweepPlan.verify_combos``):
  k + 1 new tokens per sequence after ``context`` cached ones, attention ``decode_attention.verify_attention``,
  logits at every position, each op costed by ``roofline.speculative.verify_step`` (a mixed step of k + 1-token
  chunks). Its points are keyed as a chunk after a cached prefix: new_tokens k + 1, cached the context, context
  the context + k + 1 (the sequence after the step), so each k is its own step;
* precision: by default each module as the checkpoint stores it (a quantized checkpoint's own formats, as our
  kernels run them: ``kernels.run_precision``; a float model's, the activation dtype); ``weight_dtypes`` (the
  activation dtype = dequantized, a registered format: int8, int4, fp8, fp8-block, mxfp4, nvfp4, or
  ``module=format`` pairs) and ``kv_dtypes`` (the activation dtype, int8, fp8) run one after the other into the
  same file, each point keyed by the weights it ran (``RunPrecision.weight_label``), so runs of one workload at
  several precisions sit side by side. The header records each variant's precision per module and its notes.

One sweep for one rank and N: ``run_sweep(plan, writer, group=...)`` runs on every rank of a tensor-parallel
group (``profiler.distributed.Rank``; ``writer`` only on rank 0), one rank being the trivial group
(``profiler.distributed.OneRank``, the default). With N ranks:

* rank 0 decides what remains (a point is done when every rank's line for it is in the file, so
  ``--resume`` continues a run that stopped between two ranks' lines) and broadcasts it, so every
  rank builds the same runners (``kernels.runners.make_runners(..., tp=...)``) in the same order;
* an out-of-memory error while building on any rank skips the point on every rank (the step cannot
  run without it); one while timing skips that rank's line only;
* under expert parallelism (``ep`` = the ranks) each rank holds E / N whole experts
  (``kernels.runners.make_runners(..., tp=TPGroup(ep=N))``) and the step's collectives are the phase's own
  (``roofline.parallel.step_collectives``: the dispatch / combine all-to-alls instead of the MoE layers' MLP
  all-reduce); every point records ``ep``;
* a collective is timed with the repetition count agreed over the ranks and a barrier before each
  repetition (the collectives must meet), flagged "communication" with its message and wire bytes;
* after each op, every rank's ``Measurement`` (``rank`` set) goes to rank 0, which writes them in rank
  order, each flushed as it is written: a run that stops keeps every finished point;
* no probe: on a CPU the other ranks share the machine by design (a probe would see its own peers as
  other processes), so there is no "host-busy" retry or flag.

Run a sweep with ``roofline profile`` (profiler/commands/profile.py).
"""

from __future__ import annotations

import gc
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace

from roofline import workload as W
from roofline.capacity import capacity
from roofline.cost import ZERO
from roofline.errors import RooflineError
from roofline.models import ModelConfig
from roofline.records import Measurement, WorkloadPoint
from roofline.layer import LAYER_OP, check_runnable, op_names
from roofline.parallel import COLLECTIVE_OPS, EP_COLLECTIVES, shard, step_collectives
from roofline.speculative import verify_step

from . import probes
from .distributed import OneRank
from .timing import measure, now



def expected_ops(model: ModelConfig) -> tuple:
    """What kernels.runners.make_runners builds for ``model``: every op of its layer list, then the layer op."""
    return op_names(model) + (LAYER_OP,)


PHASES = ("prefill", "decode", "verify")   # verify: with ``spec`` only (speculative decoding's verify step)
BACKENDS = ("triton", "torch")
# The Triton interpreter runs programs one by one in Python: only tiny shapes finish.
INTERPRETER_MAX_HIDDEN = 128
INTERPRETER_MAX_TOKENS = 256     # batch x context


@dataclass(frozen=True)
class SweepPlan:
    model: ModelConfig
    phases: tuple = PHASES
    batches: tuple = (1,)
    contexts: tuple = (128,)
    backends: tuple = ("torch",)
    dtype: str = "fp32"
    device: str = "cpu"            # "cpu" | "cuda[:i]"
    budget_s: float = 0.1          # timed repetitions per op
    warmup_s: float = 0.025
    ops: tuple | None = None       # None: every op the runners provide
    flush_bytes: int = 0           # CPU: write this many bytes between repetitions (GPU: always flushed)
    weight_dtypes: tuple = ()      # () = the model's own; else each (dtype = dequantized, a format, module=format)
    kv_dtypes: tuple = ()          # () = the model's own; else each of dtype, "int8", "fp8"
    group_size: int = 128          # int4 weights: input rows per scale
    zero_point: bool = False       # int4 weights: a zero point per group
    spec: tuple = ()               # phase "verify": draft counts k per verify step (roofline profile --spec)

    def combos(self) -> list:
        """(phase, backend, batch, context) of prefill and decode in the order they run: small first, so early lines
        are cheap (the verify steps: ``verify_combos``)."""
        return [(ph, be, b, c) for ph in self.phases if ph != "verify" for be in self.backends
                for b in self.batches for c in self.contexts]

    def verify_combos(self) -> list:
        """(backend, batch, context, k) of the verify steps (phase "verify"), run after ``combos``."""
        if "verify" not in self.phases:
            return []
        return [(be, b, c, k) for be in self.backends for b in self.batches for c in self.contexts for k in self.spec]

    @property
    def points(self) -> int:
        """Grid points per variant: ``combos`` and ``verify_combos``."""
        return len(self.combos()) + len(self.verify_combos())

    def variants(self) -> list:
        """(weight flag, KV flag) of each pass over ``combos``, in order (None: the model's own precision)."""
        ws = self.weight_dtypes or (None,)
        kvs = self.kv_dtypes or (None,)
        return [(w, kv) for w in ws for kv in kvs]

    def precision(self, weight=None, kv=None):
        """The ``kernels.run_precision.RunPrecision`` of a variant (None: a float model without flags, which needs
        no kernels import: a float plan validates without torch)."""
        if not self.model.quantization and weight in (None, self.dtype) and kv in (None, self.dtype):
            return None
        from kernels.run_precision import run_precision   # kernels imports torch: deferred

        return run_precision(self.model, self.dtype, weight, kv, group_size=self.group_size,
                             zero_point=self.zero_point)

    def labels(self, weight=None, kv=None) -> tuple:
        """(weight label, KV label) a variant's points are keyed by: what runs (``RunPrecision.weight_label``)."""
        rp = self.precision(weight, kv)
        return (self.dtype, self.dtype) if rp is None else (rp.weight_label, rp.kv_dtype)

    @property
    def quantized(self) -> bool:
        return any(self.labels(w, kv) != (self.dtype, self.dtype) for w, kv in self.variants())

    @property
    def op_names(self) -> tuple:
        return tuple(self.ops) if self.ops else expected_ops(self.model)

    def settings(self) -> dict:
        out = {"phases": list(self.phases), "batches": list(self.batches), "contexts": list(self.contexts),
               "backends": list(self.backends), "dtype": self.dtype, "device": self.device,
               "budget_s": self.budget_s, "warmup_s": self.warmup_s, "ops": list(self.op_names),
               "cpu_flush_bytes": self.flush_bytes}
        if self.spec:                 # only then: a run without speculation keeps the settings older files hold
            out["spec"] = list(self.spec)
        if self.quantized:            # only then: a float run's settings stay what older files hold
            own = () if self.model.quantization else (self.dtype,)   # a quantized model's own precision: []
            out.update(weight_dtypes=list(self.weight_dtypes or own), kv_dtypes=list(self.kv_dtypes or own))
            if "int4" in self.weight_dtypes:
                out.update(group_size=self.group_size, zero_point=self.zero_point)
            # each variant's precision per module, as asked and as run, with the notes where they differ
            out["precision"] = {self.labels(w, kv)[0]: rp.to_dict() for w, kv in self.variants()
                                if (rp := self.precision(w, kv)) is not None}
        if self.model.checkpoint:     # real weights: which files (a float run on random weights records nothing)
            from kernels.checkpoint import describe   # kernels imports torch: deferred, the CLI starts without it

            out["weights"] = describe(self.model.checkpoint)
        return out

    def validate(self) -> None:
        """RooflineError naming the rule, before anything runs."""
        m = self.model
        check_runnable(m)
        self._check_quant()
        for ph in self.phases:
            if ph not in PHASES:
                raise RooflineError(f"phase must be one of {', '.join(PHASES)}, but {ph!r} was given.")
        for be in self.backends:
            if be not in BACKENDS:
                raise RooflineError(f"backend must be one of {', '.join(BACKENDS)}, but {be!r} was given.")
        for c in self.contexts:
            if "prefill" in self.phases and c > m.max_context:
                raise RooflineError(f"context {c} is longer than {m.name}'s maximum context of {m.max_context}.")
            if "decode" in self.phases and c + 1 > m.max_context:
                raise RooflineError(f"a decode step at context {c} needs {c + 1} positions, past {m.name}'s "
                                    f"maximum context of {m.max_context}.")
        self._check_spec()
        self._check_memory()
        if "triton" in self.backends and not self.device.startswith("cuda"):
            big = max(self.batches) * max(self.contexts)
            if m.hidden > INTERPRETER_MAX_HIDDEN or big > INTERPRETER_MAX_TOKENS:
                raise RooflineError(
                    "the triton backend on a CPU runs in the Triton interpreter (one program at a time, in "
                    f"Python): only tiny shapes finish. Use --model tiny with batch x context <= "
                    f"{INTERPRETER_MAX_TOKENS} (got {m.name}, hidden {m.hidden}, batch x context {big}), "
                    "or --backends torch.")


    def _check_spec(self) -> None:
        """Phase "verify" goes with draft counts (``spec``, each a whole number >= 1) and they with it; every
        verify step's k + 1 tokens fit after the longest context; latent attention has no verify runner."""
        m, ks = self.model, self.spec
        if ("verify" in self.phases) != bool(ks):
            raise RooflineError("the verify phase goes with --spec (drafts per verify step, e.g. --spec 1,3,5) and "
                                "--spec with it: give --spec K[,K...] to time verify steps, or neither.")
        bad = [k for k in ks if isinstance(k, bool) or not isinstance(k, int) or k < 1]
        if bad:
            raise RooflineError(f"--spec takes whole numbers of draft tokens of at least 1, not {bad[0]!r}: e.g. "
                                "--spec 1,3,5.")
        if ks and max(self.contexts) + max(ks) + 1 > m.max_context:
            raise RooflineError(f"a verify step of {max(ks)} drafts at context {max(self.contexts)} needs "
                                f"{max(self.contexts) + max(ks) + 1} positions, past {m.name}'s maximum context of "
                                f"{m.max_context}: give smaller --contexts or --spec.")
        if ks and m.mla:
            raise RooflineError(f"--spec: {m.name}'s latent attention has no verify-step runner (explain --spec "
                                "costs it as a prefill chunk); profile it without --spec.")
        if ks and any(m.chunks):
            raise RooflineError(f"--spec: {m.name}'s chunked local attention (Llama-4) has no verify-step kernel yet "
                                "(explain --spec costs it); profile it without --spec.")

    def _check_quant(self) -> None:
        """Each variant's precision runs here (``kernels.run_precision``: a format our kernels have, an fp8 KV
        cache only on a GPU with it, the fused MoE's expert formats on the triton backend, int4's group dividing
        every linear, int4 on the torch backend only where torch has the op); a KV flag float or int8 / fp8."""
        allowed_kv = (self.dtype, "int8", "fp8")
        for kv in self.kv_dtypes:
            if kv not in allowed_kv:
                raise RooflineError(f"--kv-dtype takes {', '.join(allowed_kv)} (with --dtype {self.dtype}: the "
                                    f"activation dtype means not quantized), but {kv!r} was given.")
        if not self.quantized:
            return
        # kernels imports torch: deferred, a float plan validates without it
        from kernels.quant import check_model_groups, check_torch_int4
        from kernels.run_precision import check_run

        for w, kv in self.variants():
            rp = self.precision(w, kv)
            if rp is None:                    # the float variant beside quantized ones
                continue
            for be in self.backends:
                check_run(rp, self.model, be, self.device, kv)
            int4 = {f.group_size for _, f in rp.run.weights if f.name == "int4"}
            for g in int4:
                check_model_groups(self.model, g)
            if int4 and "torch" in self.backends:
                check_torch_int4(self.device)

    def _check_memory(self) -> None:
        """Refuse a grid whose largest point cannot fit the device at all (an OOM on a point that almost
        fits is recorded as skipped during the sweep; this catches sizes no allocation could hold)."""
        b, c = max(self.batches), max(self.contexts)
        have = device_memory_bytes(self.device)
        cap = point_capacity(self.model, b, c, self.dtype, "prefill" in self.phases, have, self.device)
        if have and not cap.fits:
            lo = cap.max_batch                 # the largest batch that fits at this context
            hint = f"; at context {c} about batch {lo} fits" if lo else f"; context {c} does not fit even at batch 1"
            raise RooflineError(f"batch {b} x context {c} needs about {cap.total_bytes / 1e9:,.1f} GB for one op's "
                                f"inputs, outputs and KV cache on {self.device}, more than its {have / 1e9:,.1f} GB"
                                f"{hint}. Give smaller --batches or --contexts.")


def point_capacity(cfg: ModelConfig, batch: int, context: int, dtype: str, prefill: bool, memory: float = 0.0,
                   device: str = ""):
    """``roofline.capacity`` of what one sweep point allocates (kernels.runners.make_runners): one layer of each
    kind (``ModelConfig.with_layers(1)``: its weights, every expert resident, and the embedding / lm_head
    tables), that layer's KV cache at the full context, the activations of the new tokens."""
    return capacity(cfg.with_layers(1), SimpleNamespace(name=device, memory_bytes=memory), batch, context,
                    new_tokens=context if prefill else 1, weight_dtype=dtype, act_dtype=dtype, kv_dtype=dtype,
                    windowed_kv=False)


def point_bytes(cfg: ModelConfig, batch: int, context: int, dtype: str, prefill: bool) -> float:
    """About the bytes one sweep point allocates: ``point_capacity``'s total (the capacity estimate)."""
    return point_capacity(cfg, batch, context, dtype, prefill).total_bytes


def device_memory_bytes(device: str) -> float:
    """Total memory of ``device`` (the GPU's, or the host's RAM); 0 when unknown."""
    if device.startswith("cuda"):
        try:
            import torch

            return float(torch.cuda.get_device_properties(device).total_memory)
        except Exception:  # noqa: BLE001 - no GPU visible: the caller refuses cuda elsewhere
            return 0.0
    try:
        m = re.search(r"MemTotal:\s+(\d+) kB", Path("/proc/meminfo").read_text())
        return int(m.group(1)) * 1024.0 if m else 0.0
    except OSError:
        return 0.0


def point_for(plan: SweepPlan, name: str, phase: str, backend: str, batch: int, context: int, cost,
              compute_dtype: str = "", tp: int = 1, weight_dtype: str | None = None,
              kv_dtype: str | None = None, ep: int = 1, spec_k: int = 0) -> WorkloadPoint:
    """One op's point; a verify step (``spec_k`` drafts after ``context`` cached tokens) is keyed as a chunk of
    k + 1 new tokens after a cached prefix: context = context + k + 1, cached = context."""
    new = context if phase == "prefill" else spec_k + 1 if phase == "verify" else 1
    cached = context if phase == "verify" else 0
    return WorkloadPoint(model=plan.model.name, op=name, phase=phase, batch=batch, new_tokens=new,
                         context=context + (new if phase == "verify" else 0), cost=cost,
                         dtype=plan.dtype, backend=backend, cached=cached, weight_dtype=weight_dtype or plan.dtype,
                         kv_dtype=kv_dtype or plan.dtype, compute_dtype=compute_dtype, tp=tp, ep=ep)


def formula_cost(plan: SweepPlan, name: str, phase: str, batch: int, context: int, tp: int = 1,
                 weight_dtype: str | None = None, kv_dtype: str | None = None, ep: int = 1, spec_k: int = 0):
    """(Cost, compute dtype) of one op instance (or the whole layer) from roofline.workload at the variant's
    precision (``SweepPlan.precision``: the weight / KV flags, None the model's own), per rank under ``tp`` /
    ``ep`` (the experts at the expected load); a collective (tensor parallelism's all-reduces, expert
    parallelism's all-to-alls) costs 0 here: its bytes cross the interconnect, not HBM. A verify step (phase
    "verify", ``spec_k`` drafts): ``roofline.speculative.verify_step``'s."""
    if name in COLLECTIVE_OPS + EP_COLLECTIVES:
        return ZERO, plan.dtype
    rp = plan.precision(weight_dtype, kv_dtype)
    wl, kvl = plan.labels(weight_dtype, kv_dtype)
    kw = dict(weight_dtype=wl, act_dtype=plan.dtype, kv_dtype=kvl, tp=tp, **({"ep": ep} if ep != 1 else {}),
              **({"precision": rp.run} if rp is not None else {}))
    ph = (W.prefill(plan.model, batch, context, **kw) if phase == "prefill" else
          W.decode(plan.model, batch, context, **kw) if phase == "decode" else
          verify_step(plan.model, batch, context, spec_k, **kw))
    o = ph.op(name)
    return o.cost, o.compute_dtype


def is_oom(e: BaseException) -> bool:
    """A device or host out-of-memory error (torch.OutOfMemoryError, or a RuntimeError saying so)."""
    if isinstance(e, MemoryError):
        return True
    try:
        import torch

        if isinstance(e, torch.OutOfMemoryError):
            return True
    except (ImportError, AttributeError):  # pragma: no cover
        pass
    msg = str(e).lower()
    return isinstance(e, RuntimeError) and ("out of memory" in msg or "can't allocate memory" in msg)


def _free_memory(device: str, after_oom: bool = False) -> None:
    """Return freed memory. A full gc pass costs ~50-100 ms with torch loaded: only on a GPU or after an OOM."""
    if device.startswith("cuda") or after_oom:
        gc.collect()
    if device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()


@dataclass
class SweepStats:
    measured: int = 0
    skipped: int = 0
    resumed: int = 0         # already in the file
    kernel_time_s: float = 0.0   # sum of every timed sample
    wall_s: float = 0.0
    notes: list = field(default_factory=list)


def _default_make_runners():
    from kernels.runners import make_runners   # kernels imports torch: deferred, a plan builds without it

    return make_runners


COMM_MIN_REPS = 20   # collectives: gloo's wake-ups are bimodal on small VMs (0.3 ms / 4 ms); 5 samples are not enough


def sweep_ops(plan: SweepPlan, tp: int = 1, ep: int = 1) -> tuple:
    """What a sweep times per point: the plan's ops (default: every op and the layer) then, over ``tp`` ranks with
    ``ep``, the step's own collectives (``roofline.parallel.step_collectives``: none on one rank; under --ep the
    all-to-alls replace the MoE layers' MLP all-reduce; their names do not depend on the batch or the context)."""
    if plan.ops:
        return tuple(plan.ops)
    coll = step_collectives(plan.model, shard(plan.model, tp, ep), 1, (1,), plan.dtype)
    return expected_ops(plan.model) + tuple(c.name for c in coll)


def _done_pairs(writer) -> set:
    """(point key, rank) of every line already in the file (rank 0 only)."""
    if writer is None or writer.old is None:
        return set()
    return {(m.point.key, m.rank) for m in writer.old.measurements}


@dataclass
class _Pass:
    """One grid point of one variant, as the sweep walks it."""
    phase: str
    backend: str
    batch: int
    context: int
    q: dict                  # {} (float, the model's own) or {"flags": the variant's flags, "keys": its key labels}
    par: dict                # {"tp": N, "ep": N} under N ranks, else {}
    label: str
    spec_k: int = 0          # phase "verify": the verify step's drafts

    @property
    def flags(self) -> dict:
        """The variant's --weight-dtype / --kv-dtype (absent: the model's own)."""
        return self.q.get("flags", {})

    def point(self, plan, name, cost, cdt=""):
        return point_for(plan, name, self.phase, self.backend, self.batch, self.context, cost, cdt, **self.par,
                         **self.q.get("keys", {}), **self.spec)

    @property
    def spec(self) -> dict:
        """The verify step's drafts as a keyword (``spec_k``), {} for prefill and decode."""
        return {"spec_k": self.spec_k} if self.spec_k else {}


def _passes(plan: SweepPlan, world: int, ep: int):
    grid = [c + (0,) for c in plan.combos()] + [("verify", *c) for c in plan.verify_combos()]
    for (wdt, kvdt), (phase, backend, batch, context, k) in ((v, c) for v in plan.variants() for c in grid):
        flags = {k: v for k, v in (("weight_dtype", wdt), ("kv_dtype", kvdt)) if v is not None}
        wl, kvl = plan.labels(wdt, kvdt)
        q = {"flags": flags, "keys": {"weight_dtype": wl, "kv_dtype": kvl}} if flags or (wl, kvl) != (
            plan.dtype, plan.dtype) else {}
        par = {"tp": world, "ep": ep} if world > 1 else {}
        label = (f"{phase} {backend} b={batch} ctx={context}" + (f" k={k}" if k else "")
                 + (f" tp{world}" if world > 1 else "")
                 + (f" ep{ep}" if ep > 1 else "")
                 + "".join(f" {k[0]}:{v}" for k, v in (("w", wl), ("kv", kvl)) if q and v != plan.dtype))
        yield _Pass(phase, backend, batch, context, q, par, label, k)


def run_sweep(plan: SweepPlan, writer, *, make_runners=None, probe=None, progress=None, device_name: str = "",
              group=None, ep: int = 1) -> SweepStats:
    """Measure every op of ``plan`` not yet in the file on every rank of ``group`` (default: this process alone),
    experts over ``ep`` ranks (1, or the world); rank 0 writes through ``writer`` and gets the counts.

    ``progress(advance, description)`` is called after each op (advance = ops finished).
    """
    group = group or OneRank(plan.device)
    make_runners = make_runners or _default_make_runners()
    if group.world == 1:
        probe = probe or probes.CpuProbe()
    static = probe.static() if probe is not None and probe.kind == "gpu" else {}  # a CPU's facts carry no clocks
    stats, t_start = SweepStats(), now()
    progress = progress or (lambda n, d: None)
    lead = group.rank == 0
    have = _done_pairs(writer) if lead else set()
    names = sweep_ops(plan, group.world, ep)
    tpkw = {"tp": replace(group.tp, ep=ep)} if group.world > 1 else {}
    for ps in _passes(plan, group.world, ep):
        todo = None
        if lead:
            keys = {n: ps.point(plan, n, ZERO).key for n in names}   # the key ignores the cost: ZERO stands in
            todo = [n for n in names if not all((keys[n], r) in have for r in range(group.world))]
            stats.resumed += len(names) - len(todo)
            progress(len(names) - len(todo), ps.label)
        todo = group.bcast(todo)
        if not todo:
            continue
        runners, verdict = _build(group, plan, make_runners, ps, todo, len(names), tpkw)
        if verdict:
            if lead:
                for n in todo:
                    cost, cdt = formula_cost(plan, n, ps.phase, ps.batch, ps.context, **ps.par, **ps.flags, **ps.spec)
                    for r in range(group.world):
                        _write(writer, stats, Measurement(point=ps.point(plan, n, cost, cdt), status="skipped",
                                                          reason=verdict, device=device_name,
                                                          timer=_timer(group.device), rank=r))
                progress(len(todo), ps.label)
            continue
        wanted = set(todo)
        for r in runners:
            if r.name not in wanted:
                continue
            m, spent = _time_one(group, plan, r, ps.point(plan, r.name, r.cost, r.compute_dtype), ps.backend,
                                 device_name, probe, static)
            stats.kernel_time_s += spent
            got = group.gather(m)
            if lead:
                for one in got:
                    _write(writer, stats, one)
                progress(1, ps.label)
        del runners
        _free_memory(group.device)
    group.barrier()          # every rank has finished before rank 0 reads the file back
    stats.wall_s = now() - t_start
    return stats


def _build(group, plan, make_runners, ps: _Pass, todo: list, n_names: int, tpkw: dict):
    """(this rank's runners for ``todo``, None) or ([], the reason every rank skips the point: an OOM on any)."""
    err = None
    qkw = dict(ps.flags, group_size=plan.group_size, zero_point=plan.zero_point) if ps.q else {}
    ops = list(todo) if plan.ops or len(todo) < n_names or group.world > 1 else None
    try:
        runners = make_runners(plan.model, ps.phase, ps.batch, ps.context, dtype=plan.dtype, backend=ps.backend,
                               device=group.device, seed=0, ops=ops, **tpkw, **qkw, **ps.spec)
    except Exception as e:  # noqa: BLE001 - only OOM is survivable; anything else is re-raised
        if not is_oom(e):
            raise
        where = f" on rank {group.rank}" if group.world > 1 else ""
        runners, err = [], f"out of memory while allocating inputs{where}: {_short(e)}"
        _free_memory(group.device, after_oom=True)
    errs = [e for e in (group.gather(err) or []) if e]
    return runners, group.bcast(errs[0] if errs else None)


RETRY_FLAGS = ("host-busy",)  # transient: measure once more and keep the retry
RETRIES = 1


def _timed(plan: SweepPlan, fn, probe, static, device: str):
    """Time ``fn`` with probe samples around it; a point disturbed by other processes is timed once more.

    Throttling is not retried (a hot GPU stays hot): it is flagged. Returns the last timing,
    the kernel time of every try (for the overhead figures), the samples, flags and tries.
    No probe (N ranks): timed once, no samples, no flags.
    """
    spent, tries = 0.0, 0
    while True:
        tries += 1
        before = probe.sample() if probe is not None else {}
        t = measure(fn, device, budget_s=plan.budget_s, warmup_s=plan.warmup_s, flush_bytes=plan.flush_bytes)
        after = probe.sample() if probe is not None else {}
        spent += sum(t.times_s)
        flags = probes.point_flags(before, after, static) if probe is not None else ()
        if tries > RETRIES or not any(f in RETRY_FLAGS for f in flags):
            return t, spent, before, after, flags, tries


def _time_one(group, plan, r, point, backend, device_name, probe, static):
    """(this rank's Measurement of runner ``r``, seconds spent in timed samples)."""
    flags = tuple(getattr(r, "flags", ()))
    comm = "communication" in flags
    try:
        if comm:
            t = measure(r.fn, group.device, budget_s=plan.budget_s, warmup_s=plan.warmup_s, min_reps=COMM_MIN_REPS,
                        max_reps=500, agree=group.agree_max, between=group.barrier)
            spent, before, after, pflags, tries = sum(t.times_s), {}, {}, (), 1
        else:
            t, spent, before, after, pflags, tries = _timed(plan, r.fn, probe, static, group.device)
    except Exception as e:  # noqa: BLE001
        if comm or not is_oom(e):
            raise
        _free_memory(group.device, after_oom=True)
        return Measurement(point=point, status="skipped", reason=f"out of memory while running: {_short(e)}",
                           device=device_name, timer=_timer(group.device), rank=group.rank), 0.0
    config = {**dict(r.config), **t.config, **({"tries": tries} if tries > 1 else {}),
              **({"rank_device": group.device} if group.world > 1 else {})}
    m = Measurement(point=point, times_s=t.times_s, timer=t.timer, l2_policy=t.l2_policy, config=config,
                    device=device_name, clocks={"before": before, "after": after} if before or after else {},
                    flags=flags + pflags + _backend_flags(replace(plan, device=group.device), backend),
                    rank=group.rank)
    return m, spent


def _backend_flags(plan: SweepPlan, backend: str) -> tuple:
    """Triton off a GPU runs in its interpreter: say so in every record it produces."""
    return ("triton-interpreter",) if backend == "triton" and not plan.device.startswith("cuda") else ()


def _short(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"


def _timer(device: str) -> str:
    return "cuda-events" if device.startswith("cuda") else "cpu-clock"


def _write(writer, stats, m: Measurement) -> None:
    writer.write(m)
    if m.ok:
        stats.measured += 1
    else:
        stats.skipped += 1
