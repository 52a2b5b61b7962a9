"""``roofline latency`` (serving runs: TTFT, TPOT, ITL, goodput) and ``roofline diagnose`` (evidence -> advice).

    roofline latency                                   # small model, 8 Poisson requests, chunk budget 64
    roofline latency --sweep-chunks 16,64,256,none     # the TTFT vs stall trade-off
    roofline latency --shared-prefix 192               # prefix reuse on, against a no-reuse baseline
    roofline latency --slo ttft=200ms,tpot=50ms,e2e=2s --json
    roofline diagnose roofline-out/latency.jsonl roofline-out/results.jsonl

Results: ``OUT/latency.jsonl``: a ``RunHeader`` (kind "latency"), then per configuration one
``request`` line per request, one ``latency-step`` line per scheduler step and a
``latency-summary`` line. Timestamps: ``profiler.timing.timestamp`` (device synced), in
seconds since the configuration's loop started; arrivals are scheduled offsets.
"""

from __future__ import annotations

import json
import math
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

import click

from roofline.errors import RooflineError
from roofline.latency import FORMULAS, arrival_times, format_slo, ms, parse_slo, summarize, summary_lines

from ..cli_args import dtype_option, model_option, torch_device


def _budget_list(text: str | None) -> list:
    """'16,64,none' -> [16, 64, None]; every budget at least one token."""
    if text is None:
        return []
    out = []
    for p in [p.strip().lower() for p in str(text).split(",") if p.strip()]:
        if p in ("none", "off", "inf"):
            out.append(None)
            continue
        try:
            v = int(p)
        except ValueError:
            raise RooflineError(f"--sweep-chunks entry {p!r} is not a token count: give e.g. 16,64,256,none.") from None
        out.append(_check_budget(v, "--sweep-chunks entry"))
    if not out:
        raise RooflineError("--sweep-chunks is empty: give e.g. 16,64,256,none.")
    return out


def _check_budget(v, name="--chunk") -> int:
    if v < 1:
        raise RooflineError(f"{name} must be at least 1 token per step, but {v} was given.")
    return v


def validate(*, rate, output_tokens, prompt_tokens, requests, chunk, sweep, slo, shared_prefix, cfg) -> tuple:
    """Every rule checked before the model is built; returns (budgets, slo seconds)."""
    if not (rate > 0) or math.isinf(rate):
        raise RooflineError(f"--rate must be above zero requests per second, but {rate:g} was given.")
    if output_tokens < 1:
        raise RooflineError(f"--output-tokens must be at least 1 (prefill already yields the first token), "
                            f"but {output_tokens} was given.")
    if prompt_tokens < 1:
        raise RooflineError(f"--prompt-tokens must be at least 1, but {prompt_tokens} was given.")
    if requests < 1:
        raise RooflineError(f"--requests must be at least 1, but {requests} was given.")
    if shared_prefix < 0 or shared_prefix > prompt_tokens:
        raise RooflineError(f"--shared-prefix must be between 0 and the prompt length ({prompt_tokens}), "
                            f"but {shared_prefix} was given.")
    if prompt_tokens + output_tokens > cfg.max_context:
        raise RooflineError(f"prompt {prompt_tokens} + output {output_tokens} tokens exceed {cfg.name}'s maximum "
                            f"context of {cfg.max_context}.")
    budgets = _budget_list(sweep) if sweep is not None else [_check_budget(chunk)]
    return budgets, parse_slo(slo)


def _device_header(torch_device: str):
    """The device as `roofline profile` records it: the catalogue entry for a known GPU, else its name."""
    from roofline.devices import Device, cpu_device, find_device

    from ..ceilings import device_name

    name = device_name(torch_device)
    if not torch_device.startswith("cuda"):
        return cpu_device(name=name)
    try:
        return find_device(name)
    except RooflineError:
        return Device(key="gpu", name=name, kind="gpu", source="unknown", provenance="not in the catalogue")


def _label(budget, cache: bool) -> str:
    return f"chunk={budget if budget else 'none'},prefix-cache={'on' if cache else 'off'}"


@click.command()
@model_option(default="small")
@click.option("--backend", type=click.Choice(["torch", "triton"]), default="torch", show_default=True,
              help="kernels: torch (fast on a CPU) or our Triton kernels (the interpreter is far too slow on a CPU)")
@dtype_option(default="fp32")
@click.option("--device", "torch_device", default="auto", show_default=True, callback=torch_device,
              help="auto, cpu or cuda[:N]")
@click.option("--prompt-tokens", type=int, default=256, show_default=True, help="tokens per prompt (<bos> included)")
@click.option("--output-tokens", type=int, default=32, show_default=True, help="tokens generated per request")
@click.option("--requests", "n_requests", type=int, default=8, show_default=True)
@click.option("--rate", type=float, default=4.0, show_default=True, help="arrivals per second")
@click.option("--arrival", type=click.Choice(["fixed", "poisson"]), default="poisson", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="seeds the arrivals, prompts and weights")
@click.option("--chunk", type=int, default=64, show_default=True,
              help="token budget per scheduler step (decode tokens + prefill chunk tokens)")
@click.option("--sweep-chunks", default=None, help="several budgets, e.g. 16,64,256,none (none: whole prompts)")
@click.option("--shared-prefix", type=int, default=0, show_default=True,
              help="tokens every prompt shares; with the prefix cache on, a no-reuse baseline runs too")
@click.option("--prefix-cache/--no-prefix-cache", default=True, show_default=True)
@click.option("--block-size", type=int, default=16, show_default=True, help="prefix-cache block (tokens)")
@click.option("--max-slots", type=int, default=8, show_default=True, help="KV-cache slots: most concurrent requests")
@click.option("--threads", type=int, default=None,
              help="CPU threads for torch; default on a CPU: one less than the cores (recorded)")
@click.option("--slo", default=None, help="targets for goodput, e.g. ttft=200ms,tpot=50ms,e2e=2s")
@click.option("--out", "out_dir", default="roofline-out", show_default=True, type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="print the summaries as one JSON object")
def latency(model, backend, dtype, torch_device, prompt_tokens, output_tokens, n_requests, rate, arrival, seed, chunk,
            sweep_chunks, shared_prefix, prefix_cache, block_size, max_slots, threads, slo, out_dir, as_json):
    """Serve several requests through a continuous-batching loop; measure TTFT, TPOT, ITL, goodput."""
    budgets, slo_s = validate(rate=rate, output_tokens=output_tokens, prompt_tokens=prompt_tokens,
                              requests=n_requests, chunk=chunk, sweep=sweep_chunks, slo=slo,
                              shared_prefix=shared_prefix, cfg=model)
    if block_size < 1 or max_slots < 1 or (threads is not None and threads < 1):
        raise RooflineError("--block-size, --max-slots and --threads must be at least 1.")
    import torch

    if torch_device == "auto":
        torch_device = "cuda" if torch.cuda.is_available() else "cpu"
    old_threads = torch.get_num_threads()
    if threads is None and torch_device == "cpu":
        # NB: torch's OpenMP threads spin-wait; with every core busy, one other process on the
        # machine stretches each step many times over (measured here: 3 s -> 25 s on 2 cores).
        threads = min(old_threads, max(1, (os.cpu_count() or 2) - 1))
    if threads:
        torch.set_num_threads(threads)
    try:
        _run(model, backend, dtype, torch_device, prompt_tokens, output_tokens, n_requests, rate, arrival, seed,
             budgets, shared_prefix, prefix_cache, block_size, max_slots, slo_s, out_dir, as_json)
    finally:
        torch.set_num_threads(old_threads)     # in-process callers (tests) get their setting back


def _run(model, backend, dtype, torch_device, prompt_tokens, output_tokens, n_requests, rate, arrival, seed,
         budgets, shared_prefix, prefix_cache, block_size, max_slots, slo_s, out_dir, as_json):
    import torch

    from kernels.model import LlamaModel
    from roofline.records import ResultWriter, RunHeader

    from ..probes import git_sha, versions
    from ..serving import RequestSpec, serve, warmup
    from ..tokenizer import make_prompt

    caches = [False, True] if (prefix_cache and shared_prefix >= block_size) else [prefix_cache]
    configs = [(b, c) for b in budgets for c in caches]
    settings = {"prompt_tokens": prompt_tokens, "output_tokens": output_tokens, "requests": n_requests,
                "rate": rate, "arrival": arrival, "seed": seed, "chunk_budgets": budgets,
                "shared_prefix": shared_prefix, "block_size": block_size, "max_slots": max_slots,
                "backend": backend, "torch_device": torch_device, "threads": torch.get_num_threads(),
                "slo": slo_s, "timestamps": "profiler.timing.timestamp after a device sync; seconds since the "
                "loop started; arrival = scheduled offset"}
    header = RunHeader(device=_device_header(torch_device), model=model.to_dict(), kind="latency", dtype=dtype,
                       settings=settings, versions=versions(), git_sha=git_sha(),
                       command="roofline " + " ".join(sys.argv[1:]),
                       started=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    try:
        m = LlamaModel(model, dtype=dtype, backend=backend, device=torch_device, seed=seed, max_slots=max_slots,
                       max_len=prompt_tokens + output_tokens + 1)
    except (ValueError, RuntimeError) as e:
        raise RooflineError(f"cannot build {model.name} ({backend}, {dtype}, {torch_device}): {e}") from None
    warmup(m)
    specs = [RequestSpec(i, a, make_prompt(prompt_tokens, seed=seed * 1000 + i, shared_prefix=shared_prefix),
                         output_tokens) for i, a in enumerate(arrival_times(n_requests, rate, arrival, seed))]
    path = Path(out_dir) / "latency.jsonl"
    summaries = []
    with ResultWriter(path, header) as w:
        for budget, cache in configs:
            label = _label(budget, cache)
            click.echo(f"running {label}: {n_requests} requests, {model.name} {backend} {dtype} on {torch_device}",
                       err=True)
            for s in range(max_slots):
                m.reset(s)
            run = serve(m, specs, chunk_budget=budget, prefix_cache=cache, block_size=block_size, config=label)
            for t in run.timelines:
                w.write(t.to_dict())
            for st in run.steps:
                w.write({"type": "latency-step", "config": label, **st})
            s = summarize(run.timelines, slo_s, label, {"chunk_budget": budget, "prefix_cache": cache,
                                                        "block_size": block_size})
            w.write(s.to_dict())
            summaries.append(s)
    if as_json:
        click.echo(json.dumps({"file": str(path), "formulas": list(FORMULAS),
                               "summaries": [s.to_dict() for s in summaries]}, allow_nan=True))
        return
    click.echo(f"{model.name} ({backend}, {dtype}, {torch_device}): {n_requests} requests, prompt {prompt_tokens}, "
               f"output {output_tokens}, {arrival} arrivals at {rate:g}/s, shared prefix {shared_prefix}")
    click.echo("Formulas: " + "; ".join(FORMULAS) + ".")
    for s in summaries:
        click.echo(f"\n[{s.config}]")
        click.echo("\n".join(summary_lines(s)))
    if len(summaries) > 1:
        click.echo("\n" + comparison_table(summaries))
    click.echo(f"\nwrote {path}")


def comparison_table(summaries) -> str:
    """One row per configuration: the trade-off at a glance."""
    rows = [f"{'configuration':<30}{'TTFT p50':>12}{'TTFT p90':>12}{'TPOT p50':>12}{'ITL p99':>12}"
            f"{'ITL max':>12}{'prefilled':>10}{'goodput':>10}"]
    for s in summaries:
        g = f"{s.goodput_rps:.2f}/s" if not math.isnan(s.goodput_rps) else "n/a"
        rows.append(f"{s.config:<30}{ms(s.ttft['p50']):>12}{ms(s.ttft['p90']):>12}{ms(s.tpot['p50']):>12}"
                    f"{ms(s.itl['p99']):>12}{ms(s.itl.get('max', math.nan)):>12}{s.prefilled_tokens:>10}{g:>10}")
    slo = summaries[0].slo
    rows.append(f"goodput against SLO {format_slo(slo)}" if slo else "goodput: no SLO given (every ok request counts)")
    return "\n".join(rows)


@click.command()
@click.argument("results", nargs=-1, required=True, type=click.Path(dir_okay=True))
@click.option("--json", "as_json", is_flag=True, help="print the findings as a JSON array")
def diagnose(results, as_json):
    """Read profile and latency result files; say what bounds each phase and what to try next."""
    from roofline.diagnose import diagnose as run_rules
    from roofline.records import read_results

    files = [read_results(p) for p in results]
    findings = run_rules(files)
    if as_json:
        click.echo(json.dumps([f.to_dict() for f in findings], indent=1))
        return
    for rf in files:
        mine = [f for f in findings if f.source == str(rf.path)]
        click.echo(f"{rf.path} ({rf.header.kind}, {rf.header.model_name} on {rf.device.name}):")
        click.echo("\n".join(f.text() for f in mine) if mine else "- nothing to say: no measurements or requests.")
