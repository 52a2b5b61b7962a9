"""``roofline compare BEFORE AFTER``: judge a change from two result files of one workload.

A thin click command over ``reports.compare_report.write_compare`` (the matching and the noise
rule are ``roofline.verdicts.comparison``; the verdicts ``roofline.verdicts.change_rules``). It prints the verdicts
and the steps that moved on stdout, then the paths it wrote (``--json``: compare.json's content
instead). Files from different devices, of different models or kinds are refused (exit 2) unless
``--across-models`` (then said first; ``roofline.verdicts.same_setup``, as ``diagnose`` does).
"""

from __future__ import annotations

import click

from reports.compare_report import write_compare
from roofline import units as U
from roofline.verdicts.same_setup import ACROSS_FLAG

STEP_LINES = 12   # steps printed on the terminal; every step is in report.html and report.md


@click.command()
@click.argument("before", type=click.Path(dir_okay=True))
@click.argument("after", type=click.Path(dir_okay=True))
@click.option("--out", "out_dir", default="roofline-compare", show_default=True, type=click.Path(file_okay=False),
              help="folder for compare.json, report.html, report.md and figures/")
@click.option("--across-models", is_flag=True,
              help="compare files from different devices, models or kinds (refused otherwise)")
@click.option("--json", "as_json", is_flag=True, help="print compare.json's content on stdout instead of the summary")
def compare(before, after, out_dir, across_models, as_json):
    """Judge a change: AFTER against BEFORE, point by point, step by step, within the noise.

    \b
    roofline compare before/results.jsonl after/results.jsonl --out roofline-compare
    roofline compare bf16.jsonl w8.jsonl            # weights changed: matched without the dtype
    roofline diagnose roofline-compare/compare.json # did the change do what its rule predicted?
    """
    w = write_compare(before, after, out_dir, across_models=across_models)
    if as_json:
        click.echo(w.paths["json"].read_text(encoding="utf-8").rstrip())
        return
    c = w.comparison
    for n in c.notes:                  # across models (as asked), what the readers said (a cut last line): first
        if n.startswith(("BEFORE: ", "AFTER: ")) or ACROSS_FLAG in n:
            click.echo(f"note: {n}")
    for f in w.findings:
        click.echo(f.text())
    if c.steps and not c.judged:       # a side ran on a busy host: times only, no speed-up claimed (as the chart)
        click.echo(f"\nsteps ({len(c.steps)}), not judged (host-busy):")
        for s in c.steps[:STEP_LINES]:
            click.echo(f"  {s.title} ({s.after.backend}): {U.seconds(s.time.before)} -> {U.seconds(s.time.after)}")
        if len(c.steps) > STEP_LINES:
            click.echo(f"  ... {len(c.steps) - STEP_LINES} more in {w.paths['markdown']}")
    moved = [s for s in c.steps if s.verdict != "no change"] if c.judged else []
    if c.steps and c.judged:
        click.echo(f"\nsteps that moved ({len(moved)} of {len(c.steps)}; largest time saved or lost per step first):")
        for s in moved[:STEP_LINES]:
            click.echo(f"  {s.title} ({s.after.backend}): {s.time.text}"
                       + ("" if s.comparable else f" [not comparable: ops {', '.join(s.only_before + s.only_after)} "
                                                  "on one side only]"))
        if len(moved) > STEP_LINES:
            click.echo(f"  ... {len(moved) - STEP_LINES} more in {w.paths['markdown']}")
    click.echo("")
    for key in ("html", "markdown", "json"):
        click.echo(w.paths[key])
