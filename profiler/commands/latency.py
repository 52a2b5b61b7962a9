"""``roofline latency`` (serving runs: TTFT, TPOT, ITL, goodput) and ``roofline diagnose`` (evidence -> advice).

    roofline latency                                   # small model, 8 Poisson requests, chunk budget 64
    roofline latency --sweep-chunks 16,64,256,none     # the TTFT vs stall trade-off
    roofline latency --shared-prefix 192               # prefix reuse on, against a no-reuse baseline
    roofline latency --weight-dtype int8 --kv-dtype int8   # the same seeded model, quantized at build time
    roofline latency --slo ttft=200ms,tpot=50ms,e2e=2s --json
    roofline latency --model tiny --spec 3 --draft tiny    # speculative decoding beside the plain run
    roofline latency --endpoint http://127.0.0.1:8000 --max-concurrency 1,8   # a served model, from outside
    roofline diagnose roofline-out/latency.jsonl roofline-out/results.jsonl
    roofline diagnose roofline-out/latency.jsonl --model llama-3-8b --device h100   # the floor under each latency

Results: ``OUT/latency.jsonl``: a ``RunHeader`` (kind "latency"), then per configuration one
``request`` line per request *as it finishes*, one ``latency-step`` line per scheduler step and
a ``latency-summary`` line. Timestamps: ``profiler.timing.timestamp`` (device synced), in
seconds since the configuration's loop started; arrivals are scheduled offsets. The work is
``profiler.run.run_latency`` (``profiler.endpoint_run.run_endpoint`` with ``--endpoint``: the
same file, measured by an OpenAI-compatible client); this module parses options and prints.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import click
from click.core import ParameterSource

from roofline.verdicts.comparison import compare
from roofline.verdicts.compare_file import is_compare_file, read_comparison
from roofline.verdicts.diagnosis import change_findings, floor_context
from roofline.verdicts.diagnosis import diagnose as run_rules
from roofline.errors import RooflineError
from roofline.floor import check_floor_inputs
from roofline.latency import FORMULAS, format_slo, parse_slo, plain_counterpart, summary_lines
from roofline.records import read_results
from roofline.units import ms

from ..cli_args import (dtype_option, float_dtype_option, mode_of, mode_options, model_option, quant_options,
                        resolve_device, spec_options, threads_option, torch_device)
from ..endpoint_run import EndpointRun, run_endpoint
from ..latency_run import LatencyRun, run_latency
from ..serving import prefix_cache_for
from ..run import Interrupted, strict_json

MAX_RATE = 1e6      # arrivals per second: beyond this every request arrives at once anyway
MIN_RATE = 1e-3     # one request per ~17 minutes: slower runs are waiting, not measuring
MAX_REQUESTS = 100_000
MAX_TOKENS = 1 << 20


def _budget_list(text: str | None) -> list:
    """'16,64,none' -> [16, 64, None]; every budget at least one token; a repeat runs once (said)."""
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
    unique = list(dict.fromkeys(out))
    if len(unique) < len(out):
        click.echo("note: --sweep-chunks repeats a budget; each runs once.", err=True)
    return unique


def _check_budget(v, name="--chunk") -> int:
    if v < 1 or v > MAX_TOKENS:
        raise RooflineError(f"{name} must be from 1 to {MAX_TOKENS} tokens per step, but {v} was given.")
    return v


def validate(run) -> None:
    """Every rule on a run's requests (a ``LatencyRun`` or an ``EndpointRun``), checked before the model is built or
    the server called."""
    cfg = run.model or _NoLimit()
    rate, output_tokens, prompt_tokens = run.rate, run.output_tokens, run.prompt_tokens
    requests, shared_prefix = run.requests, run.shared_prefix
    if not (MIN_RATE <= rate <= MAX_RATE):
        raise RooflineError(f"--rate must be between {MIN_RATE:g} and {MAX_RATE:g} requests per second, but "
                            f"{rate:g} was given.")
    if output_tokens < 1 or output_tokens > MAX_TOKENS:
        raise RooflineError(f"--output-tokens must be from 1 (prefill already yields the first token) to "
                            f"{MAX_TOKENS}, but {output_tokens} was given.")
    if prompt_tokens < 1 or prompt_tokens > MAX_TOKENS:
        raise RooflineError(f"--prompt-tokens must be from 1 to {MAX_TOKENS}, but {prompt_tokens} was given.")
    if requests < 1 or requests > MAX_REQUESTS:
        raise RooflineError(f"--requests must be from 1 to {MAX_REQUESTS}, but {requests} was given.")
    if shared_prefix < 0 or shared_prefix > prompt_tokens:
        raise RooflineError(f"--shared-prefix must be between 0 and the prompt length ({prompt_tokens}), "
                            f"but {shared_prefix} was given.")
    if prompt_tokens + output_tokens > cfg.max_context:
        raise RooflineError(f"prompt {prompt_tokens} + output {output_tokens} tokens exceed {cfg.name}'s maximum "
                            f"context of {cfg.max_context}.")


def validate_loop(run: LatencyRun) -> None:
    """An in-process run's prefix-cache block and KV-cache slots."""
    block_size, max_slots = run.block_size, run.max_slots
    if block_size < 1 or block_size > MAX_TOKENS:
        raise RooflineError(f"--block-size must be from 1 to {MAX_TOKENS} tokens, but {block_size} was given.")
    if max_slots < 1 or max_slots > 4096:
        raise RooflineError(f"--max-slots must be from 1 to 4096, but {max_slots} was given.")


IN_PROCESS_ONLY = ("backend", "torch_device", "chunk", "sweep_chunks", "prefix_cache", "block_size", "max_slots",
                   "threads", "weight_dtype", "kv_dtype", "group_size", "zero_point", "spec_k", "draft", "verify",
                   "temperature")
ENDPOINT_ONLY = ("api", "model_name", "api_key", "max_concurrency", "timeout", "connect_timeout", "ignore_eos",
                 "usage_per_chunk")


def _concurrency_list(text: str | None) -> tuple:
    """'1,8,none' -> (1, 8, None): most requests in flight per configuration; none = no limit."""
    if text is None:
        return (None,)
    out = []
    for p in [p.strip().lower() for p in str(text).split(",") if p.strip()] or [""]:
        if p in ("none", "unlimited", "inf"):
            out.append(None)
            continue
        try:
            v = int(p)
        except ValueError:
            raise RooflineError(f"--max-concurrency entry {p!r} is not a number of requests: give e.g. 1,8,none."
                                ) from None
        if v < 1 or v > MAX_REQUESTS:
            raise RooflineError(f"--max-concurrency must be from 1 to {MAX_REQUESTS} requests in flight (or none: no "
                                f"limit), but {v} was given.")
        out.append(v)
    return tuple(dict.fromkeys(out))


def _given(ctx, names) -> list:
    src = {p.name: ctx.get_parameter_source(p.name) for p in ctx.command.params}
    return [n for n in names if src.get(n) not in (None, ParameterSource.DEFAULT, ParameterSource.ENVIRONMENT)]


def _option_name(ctx, name: str) -> str:
    p = next(p for p in ctx.command.params if p.name == name)
    return max(p.opts, key=len)


def _seconds(v, name: str) -> float:
    if not (v > 0 and math.isfinite(v)):
        raise RooflineError(f"{name} must be a positive, finite number of seconds, but {v:g} was given.")
    return v


@click.command()
@model_option(default="small")
@click.option("--backend", type=click.Choice(["torch", "triton"]), default="torch", show_default=True,
              help="kernels: torch (fast on a CPU) or our Triton kernels (the interpreter is far too slow on a CPU)")
@float_dtype_option("--dtype", "fp32", "the dtype the model runs in",
                    why="{key} is costed by `roofline explain`, not run; quantization: --weight-dtype, --kv-dtype")
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
@click.option("--prefix-cache/--no-prefix-cache", default=None,
              help="reuse cached prompt blocks across requests  [default: on; off for a model with Gated DeltaNet or Mamba-2 "
              "layers, whose state is kept at a slot's end only]")
@click.option("--block-size", type=int, default=16, show_default=True, help="prefix-cache block (tokens)")
@click.option("--max-slots", type=int, default=8, show_default=True, help="KV-cache slots: most concurrent requests")
@threads_option("CPU threads for torch; default on a CPU: one less than the cores (recorded)")
@click.option("--slo", default=None, help="targets for goodput, e.g. ttft=200ms,tpot=50ms,e2e=2s")
@click.option("--out", "out_dir", default="roofline-out", show_default=True, type=click.Path(file_okay=False))
@mode_options("OUT/latency.jsonl")
@click.option("--json", "as_json", is_flag=True, help="print the summaries as one JSON object (strict: null for "
              "undefined numbers)")
@click.option("--endpoint", default=None, metavar="URL",
              help="measure an OpenAI-compatible server at URL (vLLM, SGLang, TGI, llama.cpp, `roofline serve`) "
                   "instead of the in-process loop; --model then only describes what it serves (for floors)")
@click.option("--api", type=click.Choice(["completions", "chat"]), default="completions", show_default=True,
              help="endpoint: /v1/completions or /v1/chat/completions")
@click.option("--model-name", default=None, help="endpoint: the request's model (default: the first of /v1/models)")
@click.option("--api-key", default=None, envvar="OPENAI_API_KEY", show_envvar=True,
              help="endpoint: sent as a bearer token, never written to a file")
@click.option("--max-concurrency", default=None, help="endpoint: most requests in flight, e.g. 8; several "
              "(1,8,none) run one configuration each (default: no limit)")
@click.option("--timeout", type=float, default=600.0, show_default=True, help="endpoint: seconds per request")
@click.option("--connect-timeout", type=float, default=10.0, show_default=True,
              help="endpoint: seconds to connect")
@click.option("--ignore-eos/--no-ignore-eos", default=True, show_default=True,
              help="endpoint: ask for exactly --output-tokens (ignore_eos, min_tokens) where the server accepts it")
@click.option("--usage-per-chunk/--no-usage-per-chunk", default=True, show_default=True,
              help="endpoint: ask for usage in every chunk (exact tokens per chunk on vLLM and SGLang)")
@quant_options()
@spec_options
@click.option("--verify", type=click.Choice(["greedy", "sampled"]), default="greedy", show_default=True,
              help="decoding: greedy, or sampled (with --spec: rejection sampling); both runs the same way")
@click.option("--temperature", type=float, default=1.0, show_default=True, help="--verify sampled: the temperature")
def latency(model, backend, dtype, torch_device, prompt_tokens, output_tokens, n_requests, rate, arrival, seed, chunk,
            sweep_chunks, shared_prefix, prefix_cache, block_size, max_slots, threads, slo, out_dir, resume,
            overwrite, as_json, endpoint, api, model_name, api_key, max_concurrency, timeout, connect_timeout,
            ignore_eos, usage_per_chunk, weight_dtype, kv_dtype, group_size, zero_point, spec_k, draft, verify,
            temperature):
    """Serve several requests through a continuous-batching loop (or an endpoint); measure TTFT, TPOT, ITL, goodput."""
    ctx = click.get_current_context()
    mode = mode_of(resume, overwrite)
    if endpoint is not None:
        wrong = _given(ctx, IN_PROCESS_ONLY)
        if wrong:
            raise RooflineError(f"{_option_name(ctx, wrong[0])} shapes the in-process loop; with --endpoint the server "
                                "schedules: leave it out.")
        run = EndpointRun(url=endpoint, api=api, model_name=model_name or "",
                          model=model if _given(ctx, ("model",)) else None,
                          dtype=dtype if _given(ctx, ("dtype",)) else "", prompt_tokens=prompt_tokens,
                          output_tokens=output_tokens, requests=n_requests, rate=rate, arrival=arrival, seed=seed,
                          shared_prefix=shared_prefix, concurrency=_concurrency_list(max_concurrency),
                          timeout=timeout, connect_timeout=connect_timeout, ignore_eos=ignore_eos,
                          usage_per_chunk=usage_per_chunk, slo=parse_slo(slo), out=out_dir, mode=mode,
                          api_key=api_key or None)
        return _endpoint(run, as_json)
    wrong = _given(ctx, ENDPOINT_ONLY)
    if wrong:
        raise RooflineError(f"{_option_name(ctx, wrong[0])} is for --endpoint runs: add --endpoint URL, or leave it out.")
    budgets = _budget_list(sweep_chunks) if sweep_chunks is not None else [_check_budget(chunk)]
    run = LatencyRun(model=model, backend=backend, dtype=dtype, device=torch_device, prompt_tokens=prompt_tokens,
                     output_tokens=output_tokens, requests=n_requests, rate=rate, arrival=arrival, seed=seed,
                     budgets=tuple(budgets), shared_prefix=shared_prefix,
                     prefix_cache=prefix_cache_for(model, prefix_cache),
                     block_size=block_size, max_slots=max_slots, threads=threads, slo=parse_slo(slo), out=out_dir,
                     mode=mode, weight_dtype=weight_dtype, kv_dtype=kv_dtype, group_size=group_size,
                     zero_point=zero_point, spec=spec_k or 0, draft=draft, draft_arg=ctx.meta.get("draft_arg", ""),
                     verify=verify, temperature=temperature)
    validate(run)
    validate_loop(run)
    if run.device == "auto":
        import torch

        run = replace(run, device="cuda" if torch.cuda.is_available() else "cpu")
    try:
        result = run_latency(run, say=lambda m: click.echo(m, err=True))
    except Interrupted as e:
        click.echo("\n" + e.message, err=True)
        raise SystemExit(130) from None
    if as_json:
        click.echo(strict_json(result.to_json()))
        return
    q = "".join(f", {k.removesuffix('_dtype')} {v}" for k, v in run.quant.items() if k.endswith("dtype"))
    click.echo(f"{model.name} ({backend}, {dtype}{q}, {run.device}): {n_requests} requests, prompt {prompt_tokens}, "
               f"output {output_tokens}, {arrival} arrivals at {rate:g}/s, shared prefix {shared_prefix}")
    click.echo("Formulas: " + "; ".join(FORMULAS) + ".")
    _print_summaries(result)


def _endpoint(run: EndpointRun, as_json: bool) -> None:
    """``roofline latency --endpoint``: validate, run ``run_endpoint``, print like an in-process run."""
    validate(run)
    _seconds(run.timeout, "--timeout")
    _seconds(run.connect_timeout, "--connect-timeout")
    try:
        result = run_endpoint(run, say=lambda m: click.echo(m, err=True))
    except Interrupted as e:
        click.echo("\n" + e.message, err=True)
        if run.api_key:
            click.echo("  (give the API key again: --api-key or OPENAI_API_KEY)", err=True)
        raise SystemExit(130) from None
    if as_json:
        click.echo(strict_json(result.to_json()))
        return
    s0 = result.summaries[0] if result.summaries else None
    click.echo(f"{run.url} ({run.api}): {run.requests} requests, prompt {run.prompt_tokens}, output "
               f"{run.output_tokens}, {run.arrival} arrivals at {run.rate:g}/s, shared prefix {run.shared_prefix}")
    if s0 is not None:
        click.echo("Formulas: " + "; ".join(s0.formulas) + ".")
    _print_summaries(result)


class _NoLimit:
    """The served model's context is the server's business when no --model describes it."""

    name, max_context = "the served model", MAX_TOKENS * 2


def _print_summaries(result) -> None:
    summaries = result.summaries
    for s in summaries:
        click.echo(f"\n[{s.config}]")
        click.echo("\n".join(summary_lines(s)))
    if len(summaries) > 1:
        click.echo("\n" + comparison_table(summaries))
    spec = speculation_table(summaries)
    if spec:
        click.echo("\n" + spec)
    if result.skipped:
        click.echo(f"\nalready in the file (not run again): {', '.join(result.skipped)}")
    click.echo(f"\nwrote {result.path}")


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


def speculation_table(summaries) -> str:
    """Each speculative configuration beside the one without speculation on the same requests (its label's prefix):
    acceptance, tokens per verify step, TPOT and ITL; '' when no summary speculated in process."""
    rows, w = [], max(len(s.config) for s in summaries) + 2 if summaries else 0
    for s in summaries:
        sp = s.speculation
        if not sp:
            continue
        base = plain_counterpart(s, summaries)
        if not rows:
            rows.append(f"{'speculation':<{w}}{'accept':>8}{'tok/step':>10}{'TPOT p50':>12}{'without':>12}"
                        f"{'speedup':>9}{'ITL p50':>12}{'without':>12}")
        b_tpot, b_itl, speed = "n/a", "n/a", "n/a"
        if base is not None:
            b_tpot, b_itl = ms(base.tpot["p50"]), ms(base.itl["p50"])
            if s.tpot["p50"] > 0 and base.tpot["p50"] > 0:
                speed = f"{base.tpot['p50'] / s.tpot['p50']:.2f}x"
        acc = sp.get("acceptance", sp.get("accept_rate", math.nan))
        tps = sp.get("tokens_per_step", sp.get("accept_length", math.nan))
        rows.append(f"{s.config:<{w}}{acc:>8.3f}{tps:>10.2f}{ms(s.tpot['p50']):>12}"
                    f"{b_tpot:>12}{speed:>9}{ms(s.itl['p50']):>12}{b_itl:>12}")
    if rows:
        rows.append("without = the same requests without speculation (in process; n/a for a server's counters); "
                    "speedup = TPOT p50 without / with; the tokens "
                    "of one verify step are delivered together, so ITL p50 falls toward zero while the gaps between "
                    "verify steps grow (ITL p99)")
    return "\n".join(rows)


@click.command()
@click.argument("results", nargs=-1, required=True, type=click.Path(dir_okay=True))
@click.option("--json", "as_json", is_flag=True, help="print the findings as a JSON array")
@model_option()
@click.option("--device", "device_name", default=None,
              help="floors on this device: a catalogue name (h100, a100, l4, ...), for latency files")
@click.option("--device-file", type=click.Path(dir_okay=True), default=None, help="floors on a device from JSON")
@click.option("--peak-tflops", type=float, default=None, help="floors on a custom device: dense peak TFLOP/s")
@click.option("--bandwidth-gbs", type=float, default=None, help="floors on a custom device: memory GB/s")
@click.option("--ceilings", type=click.Path(dir_okay=True), default=None,
              help="floors on the ceilings measured by a `roofline profile` result file")
@dtype_option(default=None, help="the served dtype for the floors (default: the file's)")
@click.option("--baseline", type=click.Path(dir_okay=True), default=None,
              help="a BEFORE result file: judge the one RESULTS file (AFTER) against it, as `roofline compare` does")
@click.option("--across-models", is_flag=True,
              help="judge files of different models or devices together (and --model/--device other than "
                   "the files'), or compare them with --baseline or a compare.json; refused otherwise")
def diagnose(results, as_json, model, device_name, device_file, peak_tflops, bandwidth_gbs, ceilings, dtype,
             baseline, across_models):
    """Read profile and latency result files; say what bounds each phase and what to try next.

    With --model and --device (or --ceilings), each latency run's TTFT and TPOT are set against
    the roofline floor of their stage on that device.

    \b
    A change, judged: whether it did what its rule predicted (e.g. weight quantization:
    decode bytes down x, step time down y), from a `roofline compare` result or two files:
    roofline diagnose roofline-compare/compare.json
    roofline diagnose after.jsonl --baseline before.jsonl
    """
    compared = [p for p in results if is_compare_file(p)]
    results = [p for p in results if p not in compared]
    if baseline is not None and (len(results) != 1 or compared):
        raise click.UsageError("--baseline judges one AFTER result file against BASELINE: give exactly one results "
                               "file (not a compare.json).")
    changes = [(f"from {p}", read_comparison(p, across_models=True if across_models else None)) for p in compared]
    if baseline is not None:
        changes.append(("", compare(read_results(baseline), read_results(results[0]), across_models=across_models)))
        results = []
    change_out = [(label, c, change_findings(c, src=str(c.after.rf.path))) for label, c in changes]
    files = [read_results(p) for p in results]
    device = _floor_device(device_name, device_file, peak_tflops, bandwidth_gbs, ceilings, dtype)
    latency_files = [rf for rf in files if rf.requests]
    if device is not None:
        for rf in latency_files:
            if floor_context(rf, files, model, device, dtype) is None:
                check_floor_inputs(model if model is not None else rf.header.model, device)
    elif model is not None and latency_files and all(floor_context(rf, files, model) is None for rf in latency_files):
        raise RooflineError("--model sets the floor under the latencies, which also needs the device: give --device "
                            "(a catalogue name), --device-file, --peak-tflops/--bandwidth-gbs or --ceilings.")
    findings = run_rules(files, model=model, device=device, dtype=dtype, across_models=across_models)
    if as_json:
        click.echo(json.dumps([f.to_dict() for _, _, fs in change_out for f in fs]
                              + [f.to_dict() for f in findings], indent=1))
        return
    for f in findings:
        if f.rule == "across-models":     # said on top, before any file's findings
            click.echo(f.text())
    for label, c, fs in change_out:
        click.echo(f"The change: {c.after.rf.path} against {c.before.rf.path}" + (f" ({label})" if label else "") + ":")
        click.echo("\n".join(f.text() for f in fs))
    for rf in files:
        mine = [f for f in findings if f.source == str(rf.path)]
        click.echo(f"{rf.path} ({rf.header.kind}, {rf.header.model_name} on {rf.device.name}):")
        for n in rf.notices:
            click.echo(f"- note: {n}")
        click.echo("\n".join(f.text() for f in mine) if mine else "- nothing to say: no measurements or requests.")


def _floor_device(name, device_file, peak_tflops, bandwidth_gbs, ceilings, dtype):
    """The device the floors are computed on, or None (then each file's own ceilings, if any)."""
    given = [x for x in (name, device_file, ceilings) if x] + (["--peak-tflops"] if peak_tflops is not None or
                                                                bandwidth_gbs is not None else [])
    if len(given) > 1:
        raise RooflineError("give one of --device, --device-file, --peak-tflops/--bandwidth-gbs and --ceilings.")
    if ceilings:
        rf = read_results(ceilings)
        if not rf.device.bandwidth > 0:
            raise RooflineError(f"--ceilings {ceilings}: its device {rf.device.name} has no measured bandwidth; give a "
                                "`roofline profile` result file (or run `roofline ceilings`).")
        return rf.device
    if not given:
        return None
    return resolve_device(name, device_file, peak_tflops, bandwidth_gbs, dtype or "bf16")
