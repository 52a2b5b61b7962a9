"""``run_latency``: one in-process ``roofline latency`` as a library call.

Serves ``requests`` requests per configuration (chunk budget x prefix cache) through our
continuous-batching loop (``profiler.serving``) and writes each request the moment it
finishes. The file's rules (the one writer, resume by configuration, ``Interrupted`` on
Ctrl-C) live in ``profiler.run.run_configs``, which endpoint runs share.

With ``spec`` K and a ``draft`` model every configuration runs twice on the same requests: without speculation,
then with it (``profiler.speculation``: the draft proposes K tokens, one verify step of the target checks them,
greedy or rejection-sampled verification); the speculative run's summary carries its acceptance, tokens per
verify step and per-position acceptance (``LatencySummary.speculation``), counted from the rounds every step
records. A draft on random weights is built from the run's seed (so a draft with the target's sizes and fewer
layers holds the target's first layers) and shares the target's embedding, final norm and lm_head where their
shapes match, as EAGLE, MTP and layer-skip drafts share the target's.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace

from roofline.capacity import capacity
from roofline.devices import Device, cpu_device, find_device
from roofline.errors import RooflineError
from roofline.latency import arrival_times, format_slo, summarize
from roofline.records import RunHeader

from . import probes, serving, sweep
from .speculation import Sampler, SpecSettings, spec_summary
from .ceilings import device_name
from .run import (LatencyResult, check_output, check_writable, command_line, cpu_threads_default, quiet, run_configs,
                  started)
from .timing import cpu_threads
from .tokenizer import make_prompt


@dataclass(frozen=True)
class LatencyRun:
    """One ``roofline latency``: the model, the requests, the configurations, where it goes."""

    model: object                 # roofline.models.ModelConfig
    backend: str = "torch"
    dtype: str = "fp32"
    device: str = "cpu"           # torch device
    prompt_tokens: int = 256
    output_tokens: int = 32
    requests: int = 8
    rate: float = 4.0
    arrival: str = "poisson"
    seed: int = 0
    budgets: tuple = (64,)        # token budget per step; None = whole prompts
    shared_prefix: int = 0
    prefix_cache: bool = True
    block_size: int = 16
    max_slots: int = 8
    threads: int | None = None
    slo: dict = field(default_factory=dict)   # seconds
    out: Path = Path("roofline-out")
    mode: str = "new"
    model_arg: str = ""
    weight_dtype: str | None = None   # None: the activation dtype; "int8" / "int4" (kernels.quant)
    kv_dtype: str | None = None       # None: the activation dtype; "int8" / "fp8"
    group_size: int | None = None     # int4 weights: input rows per scale (128)
    zero_point: bool = False          # int4 weights: zero points
    spec: int = 0                     # draft tokens per verify step; 0 = no speculation
    draft: object = None              # the draft's ModelConfig (with spec)
    draft_arg: str = ""
    verify: str = "greedy"            # "greedy" | "sampled" (rejection sampling at ``temperature``)
    temperature: float = 1.0

    def __post_init__(self):
        check_output(self)
        check_spec(self)

    @property
    def sampled(self) -> bool:
        return self.verify == "sampled"

    @property
    def path(self) -> Path:
        return self.out / "latency.jsonl"

    @property
    def configs(self) -> list:
        """(budget, prefix cache, K, label): with a shared prefix and the cache on, a no-reuse baseline runs too;
        with speculation each one runs without it (K = 0), then with it."""
        caches = [False, True] if (self.prefix_cache and self.shared_prefix >= self.block_size) else [self.prefix_cache]
        ks = [0, self.spec] if self.spec else [0]
        return [(b, c, k, config_label(b, c) + (self.spec_label if k else "")) for b in self.budgets for c in caches
                for k in ks]

    @property
    def spec_label(self) -> str:
        return f",spec={self.spec}:{self.draft.name}" if self.spec else ""

    @property
    def quant(self) -> dict:
        """The quantization settings a quantized run records (and the model is built with); {} for a float run."""
        w = self.weight_dtype if self.weight_dtype not in (None, self.dtype) else None
        kv = self.kv_dtype if self.kv_dtype not in (None, self.dtype) else None
        out = {}
        if w:
            out["weight_dtype"] = w
            if w == "int4":
                out.update(group_size=self.group_size or 128, zero_point=self.zero_point)
        if kv:
            out["kv_dtype"] = kv
        return out

    def settings(self, threads: int) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "output_tokens": self.output_tokens, "requests": self.requests,
                "rate": self.rate, "arrival": self.arrival, "seed": self.seed, "chunk_budgets": list(self.budgets),
                "shared_prefix": self.shared_prefix, "block_size": self.block_size, "max_slots": self.max_slots,
                "backend": self.backend, "torch_device": self.device, "threads": threads, "slo": dict(self.slo),
                "timestamps": "profiler.timing.timestamp after a device sync; seconds since the loop started; "
                              "arrival = scheduled offset", **self.quant, **self._weights(), **self._precision(),
                **self._spec_settings()}

    def _spec_settings(self) -> dict:
        """The speculation settings ({} without): K, the draft, the verification, and the sampling when sampled."""
        out = {"verify": self.verify} if self.sampled else {}
        if self.sampled:
            out["temperature"] = self.temperature
        if self.spec:
            out.update(spec=self.spec, draft=self.draft_arg or self.draft.name)
        return out

    def _precision(self) -> dict:
        """{"precision": each module's format as asked and as run} for a quantized checkpoint or a flag; {}."""
        if not self.model.quantization and not self.quant:
            return {}
        return {"precision": run_precision_of(self).to_dict()}

    def _weights(self) -> dict:
        """{"weights": files, bytes, sha256} when the model runs on a checkpoint's real weights; {} otherwise."""
        if not self.model.checkpoint:
            return {}
        from kernels.checkpoint import describe   # kernels imports torch: deferred, the CLI starts without it

        return {"weights": describe(self.model.checkpoint)}

    def command(self, resume: bool = False) -> str:
        args = ["roofline", "latency", "--model", self.model_arg or self.model.name, "--backend", self.backend,
                "--dtype", self.dtype, "--device", self.device, "--prompt-tokens", str(self.prompt_tokens),
                "--output-tokens", str(self.output_tokens), "--requests", str(self.requests),
                "--rate", f"{self.rate:g}", "--arrival", self.arrival, "--seed", str(self.seed),
                "--sweep-chunks", ",".join("none" if b is None else str(b) for b in self.budgets),
                "--shared-prefix", str(self.shared_prefix),
                "--prefix-cache" if self.prefix_cache else "--no-prefix-cache", "--block-size", str(self.block_size),
                "--max-slots", str(self.max_slots), "--out", str(self.out)]
        if self.threads:
            args += ["--threads", str(self.threads)]
        if self.slo:
            args += ["--slo", format_slo(self.slo)]
        q = self.quant
        for k in ("weight_dtype", "kv_dtype", "group_size"):
            if k in q and not (k == "group_size" and q[k] == 128):
                args += ["--" + k.replace("_", "-"), str(q[k])]
        if q.get("zero_point"):
            args += ["--zero-point"]
        if self.spec:
            args += ["--spec", str(self.spec), "--draft", self.draft_arg or self.draft.name]
        if self.sampled:
            args += ["--verify", "sampled", "--temperature", f"{self.temperature:g}"]
        args += ["--resume"] if resume else (["--overwrite"] if self.mode == "overwrite" else [])
        return shlex.join(args)


def check_spec(run) -> None:
    """--spec with --draft (a draft with the target's vocabulary), --verify greedy or sampled, a positive temperature
    only with sampled verification."""
    if run.verify not in ("greedy", "sampled"):
        raise RooflineError(f"--verify must be greedy or sampled, not {run.verify!r}.")
    if run.spec and run.draft is None:
        raise RooflineError("--spec K needs a draft model: add --draft MODEL (a preset or config.json with the "
                            "target's vocabulary, e.g. --draft tiny for --model tiny).")
    if run.draft is not None and not run.spec:
        raise RooflineError("--draft names the draft of speculative decoding: add --spec K (draft tokens per verify "
                            "step), or leave --draft out.")
    if run.spec:
        SpecSettings(run.spec, run.verify == "sampled", run.temperature, run.seed)
        if run.draft.vocab != run.model.vocab:
            raise RooflineError(f"--draft {run.draft.name} has a vocabulary of {run.draft.vocab} tokens, --model "
                                f"{run.model.name} {run.model.vocab}: a draft proposes the target's token ids, so "
                                "give a draft with the same vocabulary.")
    elif run.temperature != 1.0 and run.verify != "sampled":
        raise RooflineError("--temperature goes with --verify sampled (greedy decoding has no temperature).")


def config_label(budget, cache: bool) -> str:
    return f"chunk={budget if budget else 'none'},prefix-cache={'on' if cache else 'off'}"


def _latency_device_header(torch_device: str):
    """The device as `roofline profile` records it: the catalogue entry for a known GPU, else its name."""
    name = device_name(torch_device)
    if not torch_device.startswith("cuda"):
        return cpu_device(name=name)
    try:
        return find_device(name)
    except RooflineError:
        return Device(key="gpu", name=name, kind="gpu", source="unknown", provenance="not in the catalogue")


def run_latency(run: LatencyRun, *, say=quiet) -> LatencyResult:
    """Serve ``run.requests`` requests per configuration; write each request as it finishes."""
    import torch

    if run.device.startswith("cuda") and not torch.cuda.is_available():
        raise RooflineError(f"--device {run.device}: no CUDA GPU is visible to torch here; use --device cpu.")
    check_writable(run.out)
    check_quant(run)
    for n in run.model.notes:
        say(f"note: {n}")
    _check_capacity(run)
    with cpu_threads(cpu_threads_default(run.device, run.threads)) as n_threads:
        header = RunHeader(device=_latency_device_header(run.device), model=run.model, kind="latency",
                           dtype=run.dtype, settings=run.settings(n_threads), versions=probes.versions(),
                           git_sha=probes.git_sha(), command=command_line(run.command(run.mode == "resume")),
                           started=started())
        specs = [serving.RequestSpec(i, a, make_prompt(run.prompt_tokens, seed=run.seed * 1000 + i,
                                               shared_prefix=run.shared_prefix), run.output_tokens)
                 for i, a in enumerate(arrival_times(run.requests, run.rate, run.arrival, run.seed))]
        configs = {label: (budget, cache, k) for budget, cache, k, label in run.configs}
        model = []

        def prepare(todo):
            model.append(_build_model(run) if todo else None)
            model.append(build_draft(run, model[0]) if todo and run.spec else None)

        def one(label, sink):
            budget, cache, k = configs[label]
            q = run_precision_of(run).describe() if run.model.quantization or run.quant else ""
            say(f"running {label}: {run.requests} requests, {run.model.name} {run.backend} {run.dtype}"
                + (f" ({q})" if q else "") + f" on {run.device}")
            m, draft = model[0], model[1] if k else None
            for s in range(run.max_slots):
                m.reset(s)
                if draft is not None:
                    draft.reset(s)
            sampler = Sampler(run.sampled, run.temperature, run.seed)     # the same seed in both runs
            result = serving.serve(m, specs, chunk_budget=budget, prefix_cache=cache, block_size=run.block_size,
                                   config=label, on_finish=sink.request, sampler=sampler, draft=draft, spec_k=k)
            for st in result.steps:
                sink.record({"type": "latency-step", "config": label, **st})
            s = summarize(result.timelines, run.slo, label, {"chunk_budget": budget, "prefix_cache": cache,
                                                             "block_size": run.block_size, "spec": k})
            if not k:
                return s
            sp = spec_summary([r for st in result.steps for r in st.get("rounds", ())])
            return replace(s, speculation={"k": k, "draft": run.draft_arg or run.draft.name, "verify": run.verify,
                                           **sp})

        return run_configs(run.path, run.mode, header, list(configs), one, say=say,
                           resume=lambda: run.command(resume=True), prepare=prepare)


def check_quant(run) -> None:
    """One-line RooflineErrors for a precision a run cannot do, before any model is built (``kernels.run_precision``:
    each module's format, the checkpoint's own or the flags', one our kernels run; int4's group dividing every linear,
    on the torch backend only where torch has the op; an fp8 KV cache only on a GPU with fp8); --group-size /
    --zero-point only with int4. ``run``: a ``LatencyRun`` or a ``roofline serve`` run (model, dtype, backend,
    device and the four quantization settings)."""
    from kernels.quant import check_model_groups, check_torch_int4
    from kernels.run_precision import check_run

    rp = run_precision_of(run)
    check_run(rp, run.model, run.backend, run.device, run.kv_dtype)
    int4 = {f.group_size for _, f in rp.run.weights if f.name == "int4"}
    if "int4" not in str(run.weight_dtype or "") and (run.group_size is not None or run.zero_point):
        raise RooflineError("--group-size and --zero-point go with int4 weights (--weight-dtype int4).")
    for g in int4:
        check_model_groups(run.model, g)
    if int4 and run.backend == "torch":
        check_torch_int4(run.device)


def run_precision_of(run):
    """The ``kernels.run_precision.RunPrecision`` a latency or serve run holds its model in."""
    from kernels.run_precision import run_precision   # kernels imports torch: deferred, the CLI starts without it

    return run_precision(run.model, run.dtype, run.weight_dtype, run.kv_dtype, group_size=run.group_size,
                         zero_point=bool(run.zero_point))


def _check_capacity(run: LatencyRun) -> None:
    check_capacity(run, run.prompt_tokens + run.output_tokens + 1, run.prompt_tokens,
                   "Give fewer --max-slots, shorter --prompt-tokens/--output-tokens")


def check_capacity(run, length: int, new_tokens: int, shorter: str) -> None:
    """Refuse, before building anything, a model whose weights and KV cache (``run.max_slots`` sequences of
    ``length`` tokens, ``new_tokens`` prefilled at once) cannot fit the device's memory (``roofline.capacity``, at
    the run's precision), with the batch that would; ``shorter`` names the run's own flags. ``run``: a
    ``LatencyRun`` or a ``roofline serve`` run."""
    have = sweep.device_memory_bytes(run.device)
    wd = run.weight_dtype if run.weight_dtype not in (None, "") else run.dtype
    rp = run_precision_of(run)
    cap = capacity(run.model, SimpleNamespace(name=run.device, memory_bytes=have), run.max_slots, length,
                   new_tokens=new_tokens, weight_dtype=wd, act_dtype=run.dtype, kv_dtype=rp.kv_dtype,
                   windowed_kv=False, precision=rp.run)   # our model allocates every layer's cache at full length
    if not cap.fits:
        raise RooflineError(f"{cap.sentence} {shorter}, quantized weights, or a device with more memory.")


def build_draft(run, target):
    """The draft model, in the run's dtype and backend with the target's slots and length; on random weights it
    shares the target's embedding, final norm and lm_head where their shapes match (see the module docstring).
    ``run``: a ``LatencyRun`` or a ``roofline serve`` run (model, draft, dtype, backend, device, seed, max_slots)."""
    from kernels.model import LlamaModel

    try:
        d = LlamaModel(run.draft, dtype=run.dtype, backend=run.backend, device=run.device, seed=run.seed,
                       max_slots=run.max_slots, max_len=target.max_len)
    except RooflineError:
        raise
    except (ValueError, RuntimeError) as e:
        raise RooflineError(f"cannot build the draft {run.draft.name} ({run.backend}, {run.dtype}, {run.device}): "
                            f"{e}") from None
    if not run.draft.checkpoint and not run.model.checkpoint:
        for key in ("embed", "final_norm", "lm_head"):
            if key in d.w and key in target.w and d.w[key].shape == target.w[key].shape:
                d.w[key] = target.w[key]
    serving.warmup(d)
    return d


def _build_model(run: LatencyRun):
    from kernels.model import LlamaModel   # kernels imports torch: deferred, the CLI starts without it

    try:
        m = LlamaModel(run.model, dtype=run.dtype, backend=run.backend, device=run.device, seed=run.seed,
                       max_slots=run.max_slots, max_len=run.prompt_tokens + run.output_tokens + 1,
                       weight_dtype=run.weight_dtype, kv_dtype=run.kv_dtype, group_size=run.group_size,
                       zero_point=run.zero_point)
    except RooflineError:
        raise
    except (ValueError, RuntimeError) as e:
        raise RooflineError(f"cannot build {run.model.name} ({run.backend}, {run.dtype}, {run.device}): {e}") from None
    serving.warmup(m)
    return m
