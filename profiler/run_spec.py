"""``RunSpec``: one ``roofline profile`` described once, frozen, and everything derived from that description.

    from profiler.run import RunSpec, default_plan, run_profile
    plan, _ = default_plan(quick=True)
    spec = RunSpec(plan, out="roofline-out", mode="overwrite")

A spec is the model, the grid (phases, batches, contexts, backends), the precision (activation, weight and KV
dtypes, int4 group size and zero point), the device and its budgets (all in ``plan``, a
``profiler.sweep.SweepPlan``), the parallelism (``tp``, ``ep``) and the run's settings (threads, quick, where and
how it writes). It is built once from the command line (``spec_from_options``) or by a caller, and serialised once:

* ``to_header(threads)``: the result header's settings (``from_header`` reads them back into the same spec);
* ``command()``: the command that reruns or resumes it, generated from ``CLI_OPTIONS`` (one row per option: its
  flag and where its value lives), starting with this environment's own ``roofline`` (``run.entry_point``);
* the points' keys: every point of the sweep carries the spec's dtypes and parallelism (``sweep.point_for``);
  ``KEY_SETTINGS`` names the header setting of each point-key field (``roofline.records.KEY_FIELDS``).

Checked once, before any rank starts: ``validate_tp`` (--tp and --ep against this machine and the model's split)
and, on resume, ``check_resume`` (a header without ``tp`` / ``ep`` reads as 1; a mismatch is refused in one line).
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from roofline.errors import RooflineError
from roofline.models import load_model
from roofline.parallel import shard
from roofline.records import PARALLEL_FIELDS

from . import probes
from .distributed import check_cpu_ranks, check_tp
from .run import check_output, entry_point
from .sweep import SweepPlan, expected_ops


GPU_DEFAULTS = dict(model="llama-3-8b", batches=(1, 2, 4, 8, 16, 32, 64, 128),
                    contexts=(128, 256, 512, 1024, 2048, 4096, 8192), backends=("triton", "torch"), dtype="bf16")


GPU_QUICK = dict(model="llama-3-8b", batches=(1, 16), contexts=(512, 2048), backends=("triton", "torch"), dtype="bf16")


CPU_DEFAULTS = dict(model="small", batches=(1, 4, 16), contexts=(64, 256), backends=("torch",), dtype="fp32")


CPU_QUICK = dict(model="small", batches=(1, 4), contexts=(64, 256), backends=("torch",), dtype="fp32")


BUDGET_MS = {"gpu": 50.0, "cpu": 40.0, "quick-gpu": 20.0, "quick-cpu": 25.0}


def default_plan(*, model=None, phases=("prefill", "decode"), batches=None, contexts=None, backends=None, dtype=None,
                 device=None, quick=False, budget_ms=None, flush_cache=False, weight_dtypes=None, kv_dtypes=None,
                 group_size=None, zero_point=False, allow_unknown_fields=False, spec=None):
    """(SweepPlan, model name as given): this machine's defaults (a GPU's or a CPU's) for what is not given.

    ``weight_dtypes`` / ``kv_dtypes``: a flag or a tuple of them (None: the model's own precision, a quantized
    checkpoint's formats; the activation dtype: unquantized, a checkpoint dequantized; a registered format: "int8",
    "int4", "fp8", "fp8-block", "mxfp4", "nvfp4", or ``module=format`` pairs; KV "int8", "fp8"); each runs in the
    same file (``SweepPlan.variants``). ``spec``: draft counts; phase "verify" times their verify steps beside."""
    import torch

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    gpu = device.startswith("cuda")
    d = (GPU_QUICK if quick else GPU_DEFAULTS) if gpu else (CPU_QUICK if quick else CPU_DEFAULTS)
    model = model or d["model"]
    cfg = load_model(model, allow_unknown_fields=bool(allow_unknown_fields)) if isinstance(model, str) else model
    dtype = dtype or d["dtype"]
    if dtype not in ("fp32", "bf16", "fp16"):
        raise RooflineError(f"--dtype must be fp32, bf16 or fp16 for a sweep, but {dtype!r} was given.")
    budget_ms = budget_ms or BUDGET_MS[("quick-" if quick else "") + ("gpu" if gpu else "cpu")]
    as_tuple = lambda v: () if v is None else ((v,) if isinstance(v, str) else tuple(v))  # noqa: E731
    ws, kvs = as_tuple(weight_dtypes), as_tuple(kv_dtypes)
    int4 = any("int4" in w for w in ws)
    if zero_point and not int4:
        raise RooflineError("--zero-point goes with int4 weights (--weight-dtype int4): int8 weights are symmetric.")
    if group_size is not None and not int4:
        raise RooflineError("--group-size goes with int4 weights (--weight-dtype int4).")
    spec = tuple(spec or ())
    phases = tuple(p for p in phases if p != "verify") + (("verify",) if spec else ())
    plan = SweepPlan(model=cfg, phases=phases, batches=tuple(batches or d["batches"]),
                     contexts=tuple(contexts or d["contexts"]), backends=tuple(backends or d["backends"]),
                     dtype=dtype, device=device, budget_s=budget_ms / 1e3,
                     warmup_s=budget_ms / (4e3 if gpu else 8e3),  # a GPU also ramps its clocks
                     flush_bytes=2 * probes.llc_bytes()[0] if flush_cache and not gpu else 0,
                     # the activation dtype alone: a float model's own (a quantized one's, dequantized)
                     weight_dtypes=ws if ws != (dtype,) or cfg.quantization else (),
                     kv_dtypes=kvs if kvs != (dtype,) or cfg.quantization else (),
                     group_size=group_size or 128, zero_point=bool(zero_point), spec=spec)
    return plan, (model if isinstance(model, str) else cfg.name)


# The header setting that holds each point-key field's values (``roofline.records.KEY_FIELDS``); None: a field a
# profile does not sweep (new_tokens follows from the phase and the context, cached is 0; a verify step's follow from
# the context and ``spec``: ``sweep.point_for``) or records elsewhere (the
# model: ``RunHeader.model``). The parallelism (``PARALLEL_FIELDS``) is a setting when > 1, read as 1 when absent.
KEY_SETTINGS = {"model": None, "op": "ops", "new_tokens": None, "phase": "phases", "backend": "backends",
                "batch": "batches", "context": "contexts", "cached": None, "dtype": "dtype",
                "weight_dtype": "weight_dtypes", "kv_dtype": "kv_dtypes", **{k: k for k in PARALLEL_FIELDS}}


@dataclass(frozen=True)
class RunSpec:
    """One ``roofline profile``: the sweep plan (model, grid, precision, device, budgets), the parallelism and
    what the run does around the sweep (module docstring)."""

    plan: SweepPlan
    out: Path = Path("roofline-out")
    mode: str = "new"             # "new" | "resume" | "overwrite"
    threads: int | None = None    # CPU: torch threads (fixed for the run, recorded)
    quick: bool = False
    csv: bool = False
    report: bool = True
    check_kernels: bool = True
    flop_check: bool = True
    model_arg: str = ""           # how the model was named (for the resume command); default: its name
    device: object = None         # a roofline Device to classify against instead of measured ceilings
    tp: int = 1                   # tensor-parallel ranks: per-rank shards and the step's collectives
    ep: int = 1                   # expert-parallel ranks (1, or = tp: E / ep whole experts per rank, all-to-alls)
    allow_unknown_fields: bool = False   # config.json keys the family does not know were let through (model notes)

    def __post_init__(self):
        check_output(self)
        object.__setattr__(self, "model_arg", self.model_arg or self.plan.model.name)

    @property
    def path(self) -> Path:
        return self.out / "results.jsonl"

    @property
    def gpu(self) -> bool:
        return self.plan.device.startswith("cuda")

    def command(self, resume: bool = False) -> str:
        """The command that runs this spec again (``resume``: continues its file), from ``CLI_OPTIONS``."""
        args = [entry_point(), "profile"]
        for flag, value in CLI_OPTIONS:
            v = value(self)
            if v is True:
                args.append(flag)
            elif v not in (None, False, ()):
                args += [flag, ",".join(map(str, v)) if isinstance(v, tuple) else str(v)]
        if resume:
            args += ["--resume"]
        elif self.mode == "overwrite":
            args += ["--overwrite"]
        return shlex.join(args)

    def to_header(self, threads: int) -> dict:
        """The result header's settings: the plan's, the threads the run had, quick, the parallelism (when > 1)."""
        extra = {k: getattr(self, k) for k in PARALLEL_FIELDS if getattr(self, k) != 1}
        if self.allow_unknown_fields:
            extra["allow_unknown_fields"] = True
        if self.model_arg != self.plan.model.name:
            extra["model_arg"] = self.model_arg
        return {**self.plan.settings(), "threads": threads, "quick": self.quick,
                "budget_ms": self.plan.budget_s * 1e3, **extra}

    @classmethod
    def from_header(cls, header, **run) -> "RunSpec":
        """The spec a result header describes (``run``: what a header does not hold: out, mode, csv, report, ...).
        A header without ``tp`` / ``ep`` (one rank, or older than them) reads as 1."""
        s, m = header.settings, header.model
        dtype = s["dtype"]
        ops = tuple(s["ops"]) if tuple(s.get("ops") or ()) != expected_ops(m) else None
        # the model's own precision: [] (a quantized checkpoint's), or [dtype] for a float model (older files too)
        same = lambda v: () if tuple(v or ()) == () or (tuple(v) == (dtype,) and not m.quantization) else tuple(v)  # noqa: E731
        plan = SweepPlan(model=m, phases=tuple(s["phases"]), batches=tuple(s["batches"]),
                         contexts=tuple(s["contexts"]), backends=tuple(s["backends"]), dtype=dtype,
                         device=s["device"], budget_s=s["budget_s"], warmup_s=s["warmup_s"], ops=ops,
                         flush_bytes=s.get("cpu_flush_bytes", 0), weight_dtypes=same(s.get("weight_dtypes")),
                         kv_dtypes=same(s.get("kv_dtypes")), group_size=s.get("group_size", 128),
                         zero_point=bool(s.get("zero_point", False)), spec=tuple(s.get("spec") or ()))
        threads = None if plan.device.startswith("cuda") else s.get("threads")
        return cls(plan, threads=threads, quick=bool(s.get("quick")), model_arg=s.get("model_arg", m.name),
                   allow_unknown_fields=bool(s.get("allow_unknown_fields")),
                   **{k: header_int(s, k) for k in PARALLEL_FIELDS}, **run)


def _int4(spec, v):
    return v if "int4" in spec.plan.weight_dtypes else None


def _csv(v: tuple) -> str:
    return ",".join(map(str, v))


# The options of `roofline profile` a spec reruns with: (flag, its value from the spec). A value of None, False or
# () is left out (the option's default), True is a bare flag, a tuple a comma-separated list.
CLI_OPTIONS = (
    ("--model", lambda s: s.model_arg),
    ("--phases", lambda s: _csv(p for p in s.plan.phases if p != "verify")),   # verify: from --spec
    ("--spec", lambda s: s.plan.spec),
    ("--batches", lambda s: _csv(s.plan.batches)),
    ("--contexts", lambda s: _csv(s.plan.contexts)),
    ("--backends", lambda s: _csv(s.plan.backends)),
    ("--dtype", lambda s: s.plan.dtype),
    ("--device", lambda s: s.plan.device),
    ("--out", lambda s: str(s.out)),
    ("--budget-ms", lambda s: f"{s.plan.budget_s * 1e3:g}"),
    ("--threads", lambda s: s.threads),
    ("--flush-cache", lambda s: bool(s.plan.flush_bytes)),
    ("--weight-dtype", lambda s: s.plan.weight_dtypes),
    ("--kv-dtype", lambda s: s.plan.kv_dtypes),
    ("--group-size", lambda s: _int4(s, s.plan.group_size) if s.plan.group_size != 128 else None),
    ("--zero-point", lambda s: bool(_int4(s, s.plan.zero_point))),
    ("--quick", lambda s: s.quick),
    ("--allow-unknown-fields", lambda s: s.allow_unknown_fields),
    *((f"--{k}", lambda s, k=k: getattr(s, k) if getattr(s, k) != 1 else None) for k in PARALLEL_FIELDS),
)


# default_plan's arguments as `roofline profile`'s options name them
PLAN_OPTIONS = {"model": "model_arg", "phases": "phases", "batches": "batches", "contexts": "contexts",
                "backends": "backends", "dtype": "dtype", "device": "device", "quick": "quick",
                "budget_ms": "budget_ms", "flush_cache": "flush_cache", "weight_dtypes": "weight_dtype",
                "kv_dtypes": "kv_dtype", "group_size": "group_size", "zero_point": "zero_point",
                "allow_unknown_fields": "allow_unknown_fields", "spec": "spec"}


def spec_from_options(opts: dict, mode: str) -> RunSpec:
    """The spec of `roofline profile`'s parsed options (``opts``: click's, by parameter name), with this machine's
    defaults (a GPU's or a CPU's) for what is not given. Nothing is checked against the machine here:
    ``validate_tp`` and the plan's checks run once, in ``run_profile``."""
    plan, model_arg = default_plan(**{k: opts.get(o) for k, o in PLAN_OPTIONS.items() if opts.get(o) is not None})
    return RunSpec(plan, out=opts.get("out_dir", "roofline-out"), mode=mode, threads=opts.get("threads"),
                   quick=bool(opts.get("quick")), csv=bool(opts.get("csv_out")), report=not opts.get("no_report"),
                   model_arg=model_arg, allow_unknown_fields=bool(opts.get("allow_unknown_fields")),
                   **{k: 1 if opts.get(k) is None else opts[k] for k in PARALLEL_FIELDS})


def header_int(settings: dict, key: str) -> int:
    """A parallelism setting of a header: 1 when the header does not record it."""
    return int(settings.get(key, 1) or 1)


def check_resume(spec: RunSpec, old_header) -> None:
    """A resume appends to a file of the same --tp and --ep only (a header without them, one rank's or older than
    them, is 1): else one line naming both values and what to do."""
    if old_header is None:
        return
    for k in PARALLEL_FIELDS:
        had, now = header_int(old_header.settings, k), getattr(spec, k)
        if had != now:
            raise RooflineError(f"cannot resume {spec.path}: it was measured with --{k} {had}, this run has --{k} "
                                f"{now}. Resume with --{k} {had}, or write this run elsewhere (--out) or with "
                                "--overwrite.")


def validate_tp(spec: RunSpec, device_count: int | None = None) -> None:
    """One-line errors for ``--tp`` and ``--ep`` before anything starts (``device_count`` stands in for torch's, in
    tests): the ranks against this machine (``profiler.distributed.check_tp``), the expert-parallel ranks are the
    --tp ranks (--tp N --ep N), and the model's split (``roofline.parallel.shard``: heads, KV heads, MLP, expert
    and shared-expert widths, experts N must divide). Dense models, mixtures of experts (every expert sliced, as
    vLLM's tensor-parallel MoE, or E / N whole experts per rank under --ep) and latent attention (heads split,
    latent replicated) all run sharded, with float, int8 or int4 weights (quantized whole, then sharded:
    ``kernels.tp``) and a float or 8-bit KV cache. What cannot run: int4 groups that a rank's row-parallel shard
    would cut, or fp8 / FP4 blocks (``kernels.run_precision.check_tp``); the plan's own checks (an 8-bit latent
    cache, fp8 without a GPU
    that has it) run before."""
    from kernels.run_precision import check_tp as check_tp_scales   # kernels imports torch: deferred

    if spec.ep != 1 and spec.tp != spec.ep:
        raise RooflineError(f"--ep {spec.ep} with --tp {spec.tp}: profile runs expert parallelism on the --tp ranks "
                            "(attention tensor-parallel over the same ranks, as `roofline explain --ep` costs it), "
                            f"so give --tp {spec.ep} --ep {spec.ep}.")
    check_tp(spec.tp, spec.plan.device, device_count)
    shard(spec.plan.model, spec.tp, spec.ep)   # one line naming the valid --tp / --ep
    check_cpu_ranks(spec.tp, spec.plan.device)   # CPU ranks beyond the CPUs only wait on each other
    for w, kv in spec.plan.variants():
        rp = spec.plan.precision(w, kv)
        if rp is not None and spec.tp > 1:
            check_tp_scales(rp, spec.plan.model, spec.tp)


def rank_threads(spec: RunSpec) -> int | None:
    """CPU threads per rank: --threads, else the cores shared out (a GPU rank needs no setting)."""
    if spec.gpu:
        return None
    return spec.threads or max(1, (os.cpu_count() or 1) // max(spec.tp, 1))
