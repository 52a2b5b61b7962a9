"""``roofline check``: every kernel and the model against their references (kernels.check), or
``--compile``: every kernel variant compiled for sm_80 / sm_90 with no GPU (kernels.compile_check).

    roofline check --backend triton --dtype bf16   # kernels, model, quantized kernels; then the quality notes
    roofline check --json
    roofline check --compile --quick                 # CI: the quick set, cached, under a minute warm
    roofline check --compile                         # before renting a GPU: the full set
    roofline check --compile --target sm_90 --kernel _prefill_attn_kernel --json

Thin: options are validated here, the work is ``kernels.check.run_checks`` or
``kernels.compile_check.run_subprocess``. Exits 1 if any check fails. With no GPU the kernels run
under the Triton interpreter on small shapes; the compile check runs in a child process with
the interpreter off (it compiles, it never launches). After the checks, the quality notes
(``kernels.check.quality_notes``): what int8 / int4 weights and an int8 KV cache do to the logits of
the same seeded model (max difference, top-1 agreement over a prompt); ``--no-quality`` skips them.
"""

from __future__ import annotations

import json

import click

from roofline.errors import RooflineError
from roofline.models import load_model

from .. import probes
from ..timing import now

TARGETS = ("sm_80", "sm_90")


@click.command()
@click.option("--backend", type=click.Choice(["triton", "torch"]), default="triton", show_default=True,
              help="which implementation to validate")
@click.option("--dtype", type=click.Choice(["fp32", "fp16", "bf16"]), default="fp32", show_default=True,
              help="activation/weight dtype of the inputs")
@click.option("--full", is_flag=True, help="also check larger shapes with the default GPU block sizes")
@click.option("--json", "as_json", is_flag=True, help="print JSON (an array of results; the compile report)")
@click.option("--compile", "compile_", is_flag=True,
              help="compile every kernel variant the launchers choose for Llama-2-7B/Llama-3-8B shapes for "
                   "sm_80 and sm_90 (no GPU needed): compile errors, shared memory, registers, spills, grids")
@click.option("--quick", is_flag=True, help="with --compile: the quick set of shapes (cached; for CI)")
@click.option("--target", default=",".join(TARGETS), show_default=True, help="with --compile: targets")
@click.option("--kernel", "kernel_names", multiple=True, help="with --compile: only this kernel (repeatable)")
@click.option("--jobs", type=int, default=None, help="with --compile: compile processes (default: CPU count)")
@click.option("--quality/--no-quality", default=True, show_default=True,
              help="print the quantization quality notes (logits of int8/int4 weights and an int8 KV cache against "
                   "the unquantized model; text output only)")
@click.option("--model", default="tiny", show_default=True,
              help="the model checks' model: a preset or a Hugging Face folder (config.json, with *.safetensors its "
                   "real weights); under the Triton interpreter keep it tiny")
@click.option("--allow-unknown-fields", "allow_unknown_fields", is_flag=True,
              help="go on past config.json keys roofline does not know (ignored: listed in the model's notes)")
def check(backend, dtype, full, as_json, compile_, quick, target, kernel_names, jobs, quality, model,
          allow_unknown_fields):
    """Validate every kernel and the model (prefill+decode, chunked, prefix reuse, backends, quantized)."""
    if compile_:
        _compile_check(quick, target, kernel_names, jobs, as_json)
        return
    if quick or kernel_names or jobs or target != ",".join(TARGETS):
        raise RooflineError("--quick, --target, --kernel and --jobs go with --compile.")
    try:
        from kernels import env  # noqa: F401  (sets TRITON_INTERPRET before triton loads)
        from kernels.check import run_checks
    except ImportError as e:  # pragma: no cover
        raise RooflineError(f"the kernels need torch and triton: {e}. Install them with "
                            "`pip install torch triton`.") from None
    cfg = load_model(model, allow_unknown_fields=allow_unknown_fields)
    _refuse_too_large(cfg, dtype)
    if cfg.checkpoint:
        _refuse_nonfinite(cfg.checkpoint)
    results = run_checks(backend=backend, dtype=dtype, quick=not full, model=cfg)
    failed = [r for r in results if not r.passed]
    if as_json:
        click.echo(json.dumps([dict(name=r.name, max_rel_err=r.max_rel_err, tol=r.tol, passed=r.passed,
                                    detail=r.detail) for r in results], indent=1))
    else:
        from kernels.env import INTERPRET   # kernels imports torch: deferred, the CLI starts without it
        mode = "Triton interpreter (no GPU), small shapes" if INTERPRET else "GPU"
        what = (f"; model {cfg.name}: checkpoint weights from {cfg.checkpoint}" if cfg.checkpoint
                else f"; model {cfg.name}, random weights")
        click.echo(f"roofline check: backend {backend}, dtype {dtype}, {mode}{what}")
        for r in results:
            click.echo(str(r))
        click.echo(f"{len(results) - len(failed)}/{len(results)} checks passed"
                   + ("" if not failed else f"; failed: {', '.join(r.name for r in failed)}"))
        if quality:
            from kernels.check import quality_notes   # kernels imports torch (deferred)

            click.echo("quality notes (what quantization does to the logits; not pass/fail):")
            for n in quality_notes(dtype):
                click.echo(f"  {n}")
    if failed:
        raise SystemExit(1)


def _refuse_too_large(cfg, dtype: str) -> None:
    """A model whose three copies (the model checks build the model, a second for chunked prefill and prefix reuse,
    and the other backend's: 4 slots of 64 positions each) cannot fit this machine's memory: one line, before any
    allocation (``roofline.capacity``)."""
    from types import SimpleNamespace

    from kernels.env import HAS_CUDA      # kernels imports torch (deferred)
    from roofline.capacity import capacity
    from roofline.units import nbytes

    from ..sweep import device_memory_bytes

    dev = "cuda" if HAS_CUDA else "cpu"
    have = device_memory_bytes(dev)
    one = capacity(cfg, SimpleNamespace(name=dev, memory_bytes=have), 4, 64, new_tokens=40, weight_dtype=dtype,
                   act_dtype=dtype, kv_dtype=dtype, windowed_kv=False).total_bytes
    if have and 3 * one > have:
        raise RooflineError(f"check --model {cfg.name}: the model checks hold three copies of the whole model "
                            f"({nbytes(one)} each in {dtype}), more than this {dev}'s {nbytes(have)}: check a "
                            "smaller model (--model tiny), or a smaller checkpoint.")


def _refuse_nonfinite(folder) -> None:
    """A checkpoint with a NaN or Inf weight: one line naming the tensor (its logits would be NaN, every model check
    a "max rel err inf" that says nothing of the kernels)."""
    from kernels.safetensors_files import nonfinite, weight_files   # kernels imports torch (deferred)

    bad = nonfinite(weight_files(folder))
    if bad:
        name, file, nans, infs = bad
        raise RooflineError(f"checkpoint {folder}: tensor {name!r} in {file} is not finite ({nans} NaN, {infs} Inf "
                            "values): the model checks would compare NaN logits; give a checkpoint with finite "
                            "weights (or --model tiny for random ones).")


def driver_notes(report: dict, driver_cuda: str | None) -> list:
    """One line per target whose ptxas is newer than this box's driver runs (it will not load the cubins)."""
    if not driver_cuda:
        return []
    out = []
    have = tuple(int(x) for x in driver_cuda.split("."))
    for name, t in report.get("targets", {}).items():
        rel = t.get("ptxas", {}).get("release", "")
        try:
            need = tuple(int(x) for x in rel.split("."))
        except ValueError:
            continue
        if need[0] > have[0]:
            out.append(f"WARNING {name}: assembled by ptxas {rel}, but this driver runs CUDA {driver_cuda}: "
                       f"it cannot load {need[0]}.x cubins (update the driver, or use a triton whose ptxas matches)")
    return out


def _compile_check(quick, target, kernel_names, jobs, as_json):
    try:
        from kernels.compile_check import format_report, run_subprocess, summary
    except ImportError as e:  # pragma: no cover
        raise RooflineError(f"the compile check needs torch and triton: {e}.") from None

    targets = [t.strip() for t in target.split(",") if t.strip()]
    bad = [t for t in targets if t not in TARGETS]
    if bad or not targets:
        raise RooflineError(f"unknown target {bad[0] if bad else target!r}: choose from {', '.join(TARGETS)} "
                            "(comma-separated).")
    t0 = now()
    report = run_subprocess(targets, quick=quick, kernels=list(kernel_names) or None, jobs=jobs)
    report["wall_s"] = now() - t0
    report["driver_notes"] = driver_notes(report, probes.cuda_driver_version())
    if report.get("error"):
        raise RooflineError(report["notice"])
    if as_json:
        click.echo(json.dumps(report, indent=1))
    else:
        click.echo(format_report(report))
        for line in report["driver_notes"]:
            click.echo(line)
        if report.get("rows"):
            click.echo(f"in {report['wall_s']:.1f} s (a newer ptxas than the GPU box's driver accepts is a known "
                       "risk: compare the releases above with `nvidia-smi`'s CUDA version)")
    if summary(report)["failed"]:
        raise SystemExit(1)
