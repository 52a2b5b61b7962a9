"""``run_latency``: one in-process ``roofline latency`` as a library call.

Serves ``requests`` requests per configuration (chunk budget x prefix cache) through our
continuous-batching loop (``profiler.serving``) and writes each request the moment it
finishes. The file's rules (the one writer, resume by configuration, ``Interrupted`` on
Ctrl-C) live in ``profiler.run.run_configs``, which endpoint runs share.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from roofline.errors import RooflineError
from roofline.records import RunHeader

from .run import LatencyResult, check_output, check_writable, command_line, quiet, run_configs, started
from .timing import cpu_threads


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

    def __post_init__(self):
        check_output(self)

    @property
    def path(self) -> Path:
        return self.out / "latency.jsonl"

    @property
    def configs(self) -> list:
        """(budget, prefix cache, label): with a shared prefix and the cache on, a no-reuse baseline runs too."""
        caches = [False, True] if (self.prefix_cache and self.shared_prefix >= self.block_size) else [self.prefix_cache]
        return [(b, c, config_label(b, c)) for b in self.budgets for c in caches]

    def settings(self, threads: int) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "output_tokens": self.output_tokens, "requests": self.requests,
                "rate": self.rate, "arrival": self.arrival, "seed": self.seed, "chunk_budgets": list(self.budgets),
                "shared_prefix": self.shared_prefix, "block_size": self.block_size, "max_slots": self.max_slots,
                "backend": self.backend, "torch_device": self.device, "threads": threads, "slo": dict(self.slo),
                "timestamps": "profiler.timing.timestamp after a device sync; seconds since the loop started; "
                              "arrival = scheduled offset"}

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
            from roofline.latency import format_slo

            args += ["--slo", format_slo(self.slo)]
        args += ["--resume"] if resume else (["--overwrite"] if self.mode == "overwrite" else [])
        return shlex.join(args)


def config_label(budget, cache: bool) -> str:
    return f"chunk={budget if budget else 'none'},prefix-cache={'on' if cache else 'off'}"


def _cpu_threads_default(device: str, threads: int | None) -> int | None:
    """On a CPU, one thread fewer than the cores: torch's OpenMP threads spin-wait, and with every
    core busy one other process stretches each step many times over (3 s -> 25 s on 2 cores)."""
    if threads is None and device == "cpu":
        return max(1, (os.cpu_count() or 2) - 1)
    return threads


def _latency_device_header(torch_device: str):
    """The device as `roofline profile` records it: the catalogue entry for a known GPU, else its name."""
    from roofline.devices import Device, cpu_device, find_device

    from .ceilings import device_name

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
    for n in run.model.notes:
        say(f"note: {n}")
    with cpu_threads(_cpu_threads_default(run.device, run.threads)) as n_threads:
        from roofline.latency import arrival_times, summarize

        from . import probes
        from .serving import RequestSpec, serve
        from .tokenizer import make_prompt

        header = RunHeader(device=_latency_device_header(run.device), model=run.model, kind="latency",
                           dtype=run.dtype, settings=run.settings(n_threads), versions=probes.versions(),
                           git_sha=probes.git_sha(), command=command_line(run.command(run.mode == "resume")),
                           started=started())
        specs = [RequestSpec(i, a, make_prompt(run.prompt_tokens, seed=run.seed * 1000 + i,
                                               shared_prefix=run.shared_prefix), run.output_tokens)
                 for i, a in enumerate(arrival_times(run.requests, run.rate, run.arrival, run.seed))]
        configs = {label: (budget, cache) for budget, cache, label in run.configs}
        model = []

        def prepare(todo):
            model.append(_build_model(run) if todo else None)

        def one(label, sink):
            budget, cache = configs[label]
            say(f"running {label}: {run.requests} requests, {run.model.name} {run.backend} {run.dtype} on "
                f"{run.device}")
            m = model[0]
            for s in range(run.max_slots):
                m.reset(s)
            result = serve(m, specs, chunk_budget=budget, prefix_cache=cache, block_size=run.block_size,
                           config=label, on_finish=sink.request)
            for st in result.steps:
                sink.record({"type": "latency-step", "config": label, **st})
            return summarize(result.timelines, run.slo, label, {"chunk_budget": budget, "prefix_cache": cache,
                                                                "block_size": run.block_size})

        return run_configs(run.path, run.mode, header, list(configs), one, say=say,
                           resume=lambda: run.command(resume=True), prepare=prepare)


def _build_model(run: LatencyRun):
    from kernels.model import LlamaModel

    from .serving import warmup

    try:
        m = LlamaModel(run.model, dtype=run.dtype, backend=run.backend, device=run.device, seed=run.seed,
                       max_slots=run.max_slots, max_len=run.prompt_tokens + run.output_tokens + 1)
    except (ValueError, RuntimeError) as e:
        raise RooflineError(f"cannot build {run.model.name} ({run.backend}, {run.dtype}, {run.device}): {e}") from None
    warmup(m)
    return m
