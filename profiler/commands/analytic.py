"""Analytic commands, no hardware needed: ``roofline devices`` and ``roofline explain``."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace

import click
from click.core import ParameterSource

from roofline.devices import CATALOGUE, COMPUTE_DTYPES, custom_link
from roofline.errors import RooflineError
from roofline.precision.formats import native_computes
from roofline.explain import (SPEC_BATCHES, ExplainSpec, explain_linear, explain_step, spec_curve, spec_curve_text,
                              spec_round_at)
from roofline.config_fields import read_json_file, show_value
from roofline.context_curve import FASTER, context_curve, context_curve_text
from roofline.models import PRESETS, load_model
from roofline.speculative import Speculation, mtp_layer

from roofline.precision import lookup
from roofline.traces.engine_steps import parse_mix
from roofline.precision import names as format_names

from ..cli_args import (FLOAT_DTYPES, analytic_quant_options, device_options, ep_option, float_dtype_option,
                        model_option, precision_option, resolve_device, weight_format_cb)


def _peak_dtype(name: str) -> str:
    """The peak a layer in format ``name`` is judged against on a custom device (--peak-tflops): its own rate
    (fp8, fp4) or its activation dtype's (a float; bf16 for a weight-only format)."""
    f = lookup(name, "weight")
    return f.compute if f.compute != "act" else (f.name if f.name in FLOAT_DTYPES else "bf16")


@click.command()
@click.option("--json", "as_json", is_flag=True, help="print one JSON array")
def devices(as_json):
    """The device catalogue: dense datasheet peaks, bandwidth, ridge, and sources."""
    if as_json:
        out = []
        for d in CATALOGUE.values():
            row = d.to_dict()
            row["ridge"] = {k: v / d.bandwidth for k, v in d.peak_flops.items()}
            row["aliases"] = list(d.aliases)
            row["nvml_names"] = list(d.nvml_names)
            out.append(row)
        click.echo(json.dumps(out, indent=1))
        return
    low = tuple(native_computes())   # the registry's tensor-core rates (fp8, fp4), a column each
    rates = ("bf16",) + low + ("fp32",)
    top = f"{'':<42}{'dense TFLOP/s':^{10 * (len(rates) - 1) + 8}}{'bandwidth':>11}{'ridge':>8}{'memory':>8}{'L2':>6}"
    hdr = (f"{'key':<16}{'name':<26}" + "".join(f"{k:>10}" for k in rates[:-1]) + f"{'fp32':>8}{'TB/s':>11}"
           f"{'FLOP/B':>8}{'GB':>8}{'MB':>6}")
    click.echo(top)
    click.echo(hdr)
    click.echo("-" * len(hdr))
    for d in CATALOGUE.values():
        tf = lambda k: f"{d.peak_flops[k] / 1e12:g}" if k in d.peak_flops else "-"  # noqa: E731
        click.echo(f"{d.key:<16}{d.name[:25]:<26}" + "".join(f"{tf(k):>10}" for k in rates[:-1]) + f"{tf('fp32'):>8}"
                   f"{d.bandwidth / 1e12:>11.3g}{_ridge16(d):>8}{d.memory_bytes / 1e9:>8.0f}"
                   f"{d.l2_bytes / 1e6:>6.0f}")
    click.echo("\nTFLOP/s are dense (no 2:4 sparsity); ridge = bf16 peak / bandwidth in FLOP/byte (fp16 on cards "
               "without bf16, marked *). Names: each key, its listed aliases (`--json`) and NVML's names.")
    click.echo("Sources: " + "; ".join(sorted({d.provenance for d in CATALOGUE.values()})) + ".")
    notes = [f"  {d.key}: {d.notes}" for d in CATALOGUE.values() if d.notes]
    if notes:
        click.echo("Notes:\n" + "\n".join(notes))
    click.echo(f"Model presets: {', '.join(PRESETS)}. Compute dtypes: {', '.join(COMPUTE_DTYPES)}.")


def _ridge16(d) -> str:
    """The bf16 ridge, or the fp16 one marked '*' on a card without bf16 (V100, T4)."""
    if "bf16" in d.peak_flops:
        return f"{d.ridge('bf16'):.0f}"
    return f"{d.ridge('fp16'):.0f}*" if "fp16" in d.peak_flops else "-"


def _explicit(name: str) -> bool:
    """Whether the option ``name`` was given on the command line (not its default)."""
    return click.get_current_context().get_parameter_source(name) not in (ParameterSource.DEFAULT, None)


def _measured_cpu(device):
    """``--device cpu``: this machine's cached measured CPU ceilings (never measured here: explain is analytic)."""
    if device.kind != "cpu" or device.peak_flops:
        return device
    from .. import ceilings   # deferred: explain starts without the probes (importlib.metadata) unless --device cpu

    c = ceilings.cached_ceilings("cpu")
    if c is None:
        raise RooflineError("--device cpu: this machine's CPU ceilings are not measured yet (explain never measures); "
                            "run `roofline ceilings --device cpu` once, or give --peak-tflops and --bandwidth-gbs.")
    return c.device


def _batch_cb(ctx, param, value):
    """--batch: one integer, or (for --spec) a comma-separated list; each checked where it is used."""
    parts = [p.strip() for p in str(value).split(",") if p.strip()]
    try:
        out = [int(p) for p in parts]
    except ValueError:
        out = []
    if not out:
        raise click.BadParameter(f"give a whole number of sequences, e.g. 8 (or with --spec a list, 1,8,64), but "
                                 f"{value!r} was given.")
    return out


def _draft_cb(ctx, param, value):
    if value is None:
        return None
    try:
        return load_model(value, allow_unknown_fields=ctx.meta.get("allow_unknown_fields", False))
    except RooflineError as e:
        raise click.BadParameter(str(e)) from None


@click.command()
@click.argument("what", required=False, type=click.Choice(["linear", "phase"]), default="phase")
@model_option(default="llama-3-8b")
@device_options
@click.option("--phase", type=click.Choice(["prefill", "decode"]), default="decode", show_default=True)
@click.option("--batch", default="1", show_default=True, callback=_batch_cb,
              help="sequences in the step (with --spec: a comma-separated list, the curve's batches "
                   "[default: 1,2,4,...,256])")
@click.option("--context", type=int, default=1024, show_default=True,
              help="prefill: prompt length; decode: tokens already in the KV cache")
@click.option("--cached", type=int, default=0, show_default=True, help="prefill: cached prefix tokens reused")
@click.option("--chunk", type=int, default=None, help="prefill: chunk size in tokens (chunked prefill)")
@click.option("--mix", default=None, metavar="MIX",
              help="a continuous-batching step instead of --phase/--batch/--context: prefill=NxQ[@C] chunks and "
                   "decode=NxC groups, e.g. prefill=1x512@1536,decode=31x2048 (one 512-token chunk after 1,536 "
                   "cached, 31 sequences decoding over 2,048 keys)")
@precision_option("--weight-dtype", "weight", help="weight format")
@float_dtype_option("--act-dtype", "bf16", "activation dtype", why="{key} quantizes weights or the KV cache: "
                    "--weight-dtype, --kv-dtype")
@precision_option("--kv-dtype", "kv", help="KV-cache format")
@click.option("--tp", type=int, default=1, show_default=True,
              help="tensor-parallel ranks: per-rank costs (Megatron sharding) plus the collectives of each step")
@ep_option
@click.option("--link-gbs", type=float, default=None,
              help="--tp: interconnect GB/s per direction [default: the device's, e.g. NVLink 4 = 450]")
@click.option("--link-latency-us", type=float, default=None,
              help="--tp with --link-gbs: microseconds of latency per collective [default: 0]")
@click.option("--tokens", type=int, default=None, help="linear: tokens (rows) sharing the weight")
@click.option("--in", "in_features", type=int, default=None, help="linear: input features K")
@click.option("--out", "out_features", type=int, default=None, help="linear: output features N")
@click.option("--dtype", default="bf16", show_default=True, callback=weight_format_cb,
              help=f"linear: the layer's format ({', '.join(format_names('weight'))}); fp8 / FP4 given here run "
                   "with activations in the same format (W8A8, W4A4) where the device has that rate")
@analytic_quant_options
@click.option("--expert-load", "expert_load", default=None, metavar="FILE",
              help="MoE: a JSON list of tokens per expert (or a list per layer, summed) -- a measured histogram, "
                   "e.g. LlamaModel.expert_counts -- instead of uniform routing")
@click.option("--spec", "spec_k", type=int, default=None, metavar="K",
              help="speculative decoding: K draft tokens per verify step; prints plain decode against speculation "
                   "across batch (with --acceptance)")
@click.option("--acceptance", type=float, default=None, help="--spec: the probability each draft token is accepted")
@click.option("--draft", "draft", default=None, callback=_draft_cb, metavar="MODEL",
              help="--spec: the draft model (a preset or config.json), costed as K decode steps")
@click.option("--mtp", is_flag=True, help="--spec: the model's multi-token-prediction layer drafts (num_nextn_predict_"
                                          "layers: DeepSeek-V3, GLM-4.5)")
@click.option("--from", "from_results", default=None, metavar="RESULTS",
              help="--spec: a results.jsonl of `roofline profile --spec K`: the same curve from its measured decode "
                   "and verify steps, beside the roofline's")
@click.option("--vs-context", "vs_context", is_flag=True,
              help="a hybrid (linear-attention layers) or sparse-attention model: its decode step across contexts "
                   "1,024 ... max beside its dense counterpart (every layer full attention), time and bytes by kind")
@click.option("--faster", type=float, default=FASTER, show_default=True,
              help="--vs-context: the speedup over the dense counterpart whose context is searched")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def explain(what, model, device_name, device_file, peak_tflops, bandwidth_gbs, phase, batch, context, cached,
            chunk, mix, weight_dtype, act_dtype, kv_dtype, tp, ep, link_gbs, link_latency_us, tokens, in_features,
            out_features, dtype, group_size, zero_point, expert_load, spec_k, acceptance, draft, mtp, from_results,
            vs_context, faster, as_json):
    """Analytic roofline of one linear layer or one model step (no hardware).

    \b
    roofline explain linear --tokens 1024 --in 4096 --out 4096 --dtype bf16 --device h100
    roofline explain --model llama-2-7b --device h100 --phase decode --batch 1 --context 1024
    roofline explain --model llama-3-70b --device h100 --tp 8 --phase decode --batch 1
    roofline explain --model mixtral-8x7b --device h100 --ep 8 --phase decode --batch 64
    roofline explain --model llama-3-8b --weight-dtype int4 --group-size 64 --kv-dtype fp8
    roofline explain --model path/to/gpt-oss-120b --device h100   # each module at the checkpoint's precision
    roofline explain --model qwen3-30b-a3b --weight-dtype experts=nvfp4,attention=fp8
    roofline explain --model llama-3-8b --device h100 --spec 3 --acceptance 0.8 [--draft MODEL | --mtp]
    roofline explain --spec 3 --acceptance 0.8 --from roofline-out/results.jsonl   # also from measured steps
    roofline explain --model path/to/qwen3-next --device h100 --vs-context   # hybrid against dense

    With no --weight-dtype / --kv-dtype a quantized checkpoint (its quantization_config, or ModelOpt's
    hf_quant_config.json beside config.json) is costed module by module as it is stored; a flag overrides it.
    """
    if (group_size is not None or zero_point) and "int4" not in (weight_dtype or "") and dtype != "int4":
        raise RooflineError("--group-size and --zero-point describe int4 weights: add --weight-dtype int4 "
                            "(or --dtype int4 for `explain linear`).")
    device = _measured_cpu(resolve_device(device_name, device_file, peak_tflops, bandwidth_gbs,
                                          dtype=_peak_dtype(dtype) if what == "linear" else act_dtype))
    speculating = spec_k is not None or acceptance is not None or draft is not None or mtp
    if from_results is not None and not speculating:
        raise RooflineError("--from reads a sweep's verify steps for the speculation curve: add --spec K "
                            "--acceptance A, or drop --from.")
    if what == "linear" and (speculating or vs_context):
        raise RooflineError("--spec, --acceptance, --draft, --mtp and --vs-context price a model's decode: drop "
                            "`linear` (and give --model).")
    if vs_context and (speculating or _explicit("context") or len(batch) > 1):
        raise RooflineError("--vs-context draws the decode step over contexts 1,024 ... the model's maximum at one "
                            "batch: drop --context and --spec / --acceptance / --draft / --mtp, and give --batch one "
                            "number.")
    if _explicit("faster") and not vs_context:
        raise RooflineError("--faster sets the speedup --vs-context searches for: add --vs-context, or drop it.")
    if what == "linear":
        missing = [n for n, v in (("--tokens", tokens), ("--in", in_features), ("--out", out_features)) if v is None]
        if missing:
            raise RooflineError(f"`explain linear` needs {', '.join(missing)} "
                                "(e.g. --tokens 1024 --in 4096 --out 4096).")
        d = explain_linear(tokens, in_features, out_features, dtype, device,
                           weight_dtype=weight_dtype if _explicit("weight_dtype") else None,
                           act_dtype=act_dtype if _explicit("act_dtype") else None,
                           group_size=group_size, zero_point=zero_point)
        click.echo(json.dumps({k: v for k, v in d.items() if k != "text"}) if as_json else d["text"])
        return
    if len(batch) > 1 and not speculating and not vs_context:
        raise RooflineError(f"--batch takes one number for a step ({','.join(map(str, batch))} was given); a list "
                            "goes with --spec K --acceptance A (the speculation curve).")
    if link_latency_us is not None and link_gbs is None:
        raise RooflineError("--link-latency-us needs --link-gbs (the link's GB/s per direction).")
    link = custom_link(link_gbs, link_latency_us or 0.0) if link_gbs is not None else None
    load = tuple(read_expert_load(expert_load, model)) if expert_load is not None else ()
    if mix is not None and (_explicit("phase") or _explicit("batch") or _explicit("context") or cached or chunk):
        raise RooflineError("--mix describes the whole step: drop --phase, --batch, --context, --cached and --chunk.")
    step_mix = parse_mix(mix) if mix is not None else None
    spec = ExplainSpec(model=model, device=device, phase=phase, batch=batch[0], context=context, cached=cached,
                       chunk=chunk, mix=(step_mix.chunks, step_mix.decodes) if step_mix else None, weight_dtype=weight_dtype, act_dtype=act_dtype, kv_dtype=kv_dtype, tp=tp, ep=ep,
                       group_size=group_size, zero_point=zero_point, expert_load=load, link=link)
    if vs_context:
        for n in model.notes:
            click.echo(f"note: {n}", err=True)
        c = context_curve(spec, faster)
        click.echo(json.dumps(c.to_dict()) if as_json else context_curve_text(c))
        return
    if speculating:
        if from_results is not None:
            _spec_from_results(spec, (spec_k, acceptance, draft, mtp), from_results,
                               batch if _explicit("batch") else None, as_json)
            return
        for n in model.notes:
            click.echo(f"note: {n}", err=True)
        d = spec_curve(spec, speculation(spec_k, acceptance, draft, mtp, model),
                       batch if _explicit("batch") else SPEC_BATCHES)
        click.echo(json.dumps(d) if as_json else spec_curve_text(d))
        return
    step = explain_step(spec)
    for n in model.notes:
        click.echo(f"note: {n}", err=True)
    click.echo(json.dumps(step.data) if as_json else step.text())


def _spec_from_results(spec: ExplainSpec, options: tuple, path, batches, as_json: bool) -> None:
    """``explain --spec --from RESULTS`` (``options``: --spec, --acceptance, --draft, --mtp): the roofline curve at
    the sweep's context and batches (its model, and its measured ceilings and dtypes, unless given), and the measured
    curve beside it (``roofline.spec_measured``)."""
    from roofline import spec_measured as M
    from roofline.analysis import analyze
    from roofline.records import read_results

    a = analyze(read_results(path))
    swept = a.header.model
    model = spec.model if _explicit("model") or swept is None else swept
    for n in model.notes:
        click.echo(f"note: {n}", err=True)
    sp = speculation(*options, model)
    M.check_sweep(a, sp.k, model.name)
    ctx, said = M.measured_context(a, sp.k, spec.context)
    verify = [s for s in a.steps if s.phase == "verify" and s.drafts == sp.k and s.cached == ctx]
    key = verify[0].key
    device_given = any(_explicit(n) for n in ("device_name", "device_file", "peak_tflops", "bandwidth_gbs"))
    spec = replace(spec, model=model, context=ctx, device=spec.device if device_given else a.device,
                   act_dtype=spec.act_dtype if _explicit("act_dtype") else key.dtype,
                   weight_dtype=spec.weight_dtype if _explicit("weight_dtype") else key.weight_dtype,
                   kv_dtype=spec.kv_dtype if _explicit("kv_dtype") else key.kv_dtype)
    d = spec_curve(spec, sp, batches or sorted({s.batch for s in verify}))
    at = spec_round_at(spec, sp) if sp.draft != "none" else None
    d["measured"] = M.measured_data(a, sp.k, sp.tokens_per_step, ctx, said,
                                    (lambda b: at(b).draft_s) if at else None)
    click.echo(json.dumps(d) if as_json else spec_curve_text(d) + "\n" + M.measured_text(d["measured"]))


def speculation(k, acceptance, draft, mtp: bool, model) -> Speculation:
    """--spec / --acceptance / --draft / --mtp as a ``Speculation``; a missing or contradictory option is one line."""
    if k is None or acceptance is None:
        raise RooflineError("speculative decoding needs --spec K (draft tokens per verify step, at least 1) and "
                            "--acceptance A (from 0 up to 1), e.g. --spec 3 --acceptance 0.8.")
    if draft is not None and mtp:
        raise RooflineError("--draft and --mtp both name the draft: give --draft MODEL (a draft model), --mtp (the "
                            "model's multi-token-prediction layer), or neither (a draft not costed).")
    if mtp:
        mtp_layer(model)            # refuses a model without MTP layers, in one line
    return Speculation(k, acceptance, "model" if draft is not None else "mtp" if mtp else "none", draft)


MAX_EXPERT_TOKENS = 1e15    # tokens one expert received: more than any trace holds, and its sum stays exact enough


def read_expert_load(path, model) -> list:
    """A measured expert histogram from a JSON file: a list of n_experts counts, or a list of such lists (one per
    layer; summed). One-line errors name what is wrong and what is allowed."""
    if not model.n_experts:
        raise RooflineError(f"--expert-load describes a mixture of experts, but {model.name} is dense: drop it.")
    try:
        d = read_json_file(path, "expert load")
    except RooflineError:
        raise
    except ValueError:     # json's int() past sys.get_int_max_str_digits() (4,300 digits)
        raise RooflineError(f"expert load {path} holds an integer of more than {sys.get_int_max_str_digits():,} "
                            f"digits, not a token count: give counts from 0 to {MAX_EXPERT_TOKENS:.0e} tokens per "
                            "expert.") from None
    rows = d if isinstance(d, list) and d and all(isinstance(r, list) for r in d) else [d]
    E = model.n_experts
    if any(not isinstance(r, list) or len(r) != E or any(isinstance(v, bool) or not isinstance(v, (int, float))
                                                         or v < 0 for v in r) for r in rows):
        raise RooflineError(f"expert load {path} must be a list of {E} counts (tokens per expert, >= 0) or a list of "
                            f"such lists, one per layer, for {model.name}'s {E} experts.")
    for layer, r in enumerate(rows):
        for e, v in enumerate(r):
            if not (isinstance(v, int) or math.isfinite(v)) or v > MAX_EXPERT_TOKENS:
                where = f"layer {layer}, expert {e}" if len(rows) > 1 else f"expert {e}"
                raise RooflineError(f"expert load {path}: {where} holds {show_value(v)}, not a token count: give "
                                    f"counts from 0 to {MAX_EXPERT_TOKENS:.0e} tokens per expert.")
    return [sum(r[e] for r in rows) for e in range(E)]
