"""``roofline check``: every kernel and the model against their references (kernels.check).

    roofline check --backend triton --dtype bf16
    roofline check --json

Thin: options are validated here, the work is ``kernels.check.run_checks``. Exits 1 if any
check fails. With no GPU the kernels run under the Triton interpreter on small shapes.
"""

from __future__ import annotations

import json

import click

from roofline.errors import RooflineError


@click.command()
@click.option("--backend", type=click.Choice(["triton", "torch"]), default="triton", show_default=True,
              help="which implementation to validate")
@click.option("--dtype", type=click.Choice(["fp32", "fp16", "bf16"]), default="fp32", show_default=True,
              help="activation/weight dtype of the inputs")
@click.option("--full", is_flag=True, help="also check larger shapes with the default GPU block sizes")
@click.option("--json", "as_json", is_flag=True, help="print one JSON array of results")
def check(backend, dtype, full, as_json):
    """Validate every kernel and the model (prefill+decode, chunked, prefix reuse, backends)."""
    try:
        from kernels import _env  # noqa: F401  (sets TRITON_INTERPRET before triton loads)
        from kernels.check import run_checks
    except ImportError as e:  # pragma: no cover
        raise RooflineError(f"the kernels need torch and triton: {e}. Install them with "
                            "`pip install torch triton`.") from None
    results = run_checks(backend=backend, dtype=dtype, quick=not full)
    failed = [r for r in results if not r.passed]
    if as_json:
        click.echo(json.dumps([dict(name=r.name, max_rel_err=r.max_rel_err, tol=r.tol, passed=r.passed,
                                    detail=r.detail) for r in results], indent=1))
    else:
        from kernels._env import INTERPRET
        mode = "Triton interpreter (no GPU), small shapes" if INTERPRET else "GPU"
        click.echo(f"roofline check: backend {backend}, dtype {dtype}, {mode}")
        for r in results:
            click.echo(str(r))
        click.echo(f"{len(results) - len(failed)}/{len(results)} checks passed"
                   + ("" if not failed else f"; failed: {', '.join(r.name for r in failed)}"))
    if failed:
        raise SystemExit(1)
