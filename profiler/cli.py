"""The ``roofline`` command line: a thin click group.

Commands live in ``profiler/commands/`` and are imported only when run, so
``roofline explain`` answers without importing torch. Bad input raises
``RooflineError`` (or click's usage error for an option value); the group prints it as
one line and exits 2 (never a traceback).
Progress goes to stderr; stdout stays parseable.
"""

from __future__ import annotations

import importlib
import sys

import click

from roofline.errors import RooflineError

# command name -> "module:attribute"
COMMANDS = {
    "devices": "profiler.commands.analytic:devices",
    "explain": "profiler.commands.analytic:explain",
    "check": "profiler.commands.check:check",            # kernels vs references
    "env": "profiler.commands.measure:env",              # versions and device state
    "ceilings": "profiler.commands.measure:ceilings",    # measured peaks and bandwidth
    "profile": "profiler.commands.profile:profile",      # batch x context sweeps
    "report": "profiler.commands.report:report",         # PNG + HTML + markdown from results
    "compare": "profiler.commands.compare:compare",      # BEFORE AFTER: what a change did, within the noise
    "latency": "profiler.commands.latency:latency",      # TTFT/TPOT timelines, serving loop
    "diagnose": "profiler.commands.latency:diagnose",    # evidence -> bound -> what to try
    "serve": "profiler.commands.serve:serve",            # our model behind an OpenAI-compatible API
    "trace": "profiler.commands.trace:trace",            # a PyTorch profiler trace on the roofline
    "counters": "profiler.commands.counters:counters",   # Nsight Compute counters on the roofline
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return sorted(COMMANDS)

    def get_command(self, ctx, name):
        target = COMMANDS.get(name)
        if target is None:
            return None
        module, attr = target.split(":")
        return getattr(importlib.import_module(module), attr)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except RooflineError as e:
            click.echo(f"Error: {e}", err=True)
            ctx.exit(2)
        except click.UsageError as e:   # a bad option value: one line too, with where to read more
            sub = e.ctx.info_name if e.ctx is not None and e.ctx.command is not self else ""
            click.echo(f"Error: {e.format_message()}" + (f" (see `roofline {sub} --help`)" if sub else ""), err=True)
            ctx.exit(2)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="roofline")
def main():
    """Why is my LLM inference slow? Roofline profiling of prefill and decode.

    \b
    Start here:  roofline explain --model llama-3-8b --device h100 --phase decode --batch 1 --context 1024
    On a GPU:    roofline profile --quick && roofline report roofline-out/results.jsonl
    """


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
