"""``roofline report RESULTS... --out DIR``: PNG/SVG figures, report.html and report.md.

A thin click command over ``reports.write_report``: it prints the paths it wrote on
stdout (HTML and markdown first), nothing else. Bad input (a missing, empty, corrupt or
too-old results file) surfaces as a one-line ``RooflineError`` through the CLI group.
"""

from __future__ import annotations

import click

from roofline.errors import RooflineError

from reports import write_report


@click.command()
@click.argument("results", nargs=-1, required=True, type=click.Path(dir_okay=True))
@click.option("--out", "out_dir", default="roofline-report", show_default=True, type=click.Path(file_okay=False),
              help="folder for report.html, report.md and figures/")
def report(results, out_dir):
    """Render one or more result files as figures, HTML and markdown.

    \b
    roofline report roofline-out/results.jsonl
    roofline report h100.jsonl a100.jsonl --out compare   # side by side, coloured by device
    """
    try:
        paths = write_report(list(results), out_dir)
    except RooflineError:
        raise
    except (KeyError, TypeError, ValueError) as e:  # a record that parsed but holds unexpected values
        raise RooflineError(f"could not report {', '.join(results)}: a record holds an unexpected value "
                            f"({type(e).__name__}: {e}).") from None
    click.echo(paths["html"])
    click.echo(paths["markdown"])
    for key, p in paths.items():
        if key.startswith("png:"):
            click.echo(p)
