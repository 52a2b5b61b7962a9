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

# command name -> ("module:attribute", the one-line summary `roofline --help` lists without importing it)
COMMANDS = {
    "devices": ("profiler.commands.analytic:devices", "List the device catalogue: peaks, bandwidth, ridge"),
    "explain": ("profiler.commands.analytic:explain", "Predict a linear layer or a model step (no hardware)"),
    "check": ("profiler.commands.check:check", "Check every kernel and the model against references"),
    "env": ("profiler.commands.measure:env", "Print versions and device state for a bug report"),
    "ceilings": ("profiler.commands.measure:ceilings", "Measure this device's bandwidth, FLOP/s, collectives"),
    "profile": ("profiler.commands.profile:profile", "Time prefill and decode over batch sizes and contexts"),
    "report": ("profiler.commands.report:report", "Draw result files as figures, HTML and markdown"),
    "compare": ("profiler.commands.compare:compare", "Judge a change: AFTER against BEFORE, beyond the noise"),
    "latency": ("profiler.commands.latency:latency", "Time requests: TTFT, TPOT through a serving loop"),
    "diagnose": ("profiler.commands.latency:diagnose", "Say what bounds each phase and what to try"),
    "serve": ("profiler.commands.serve:serve", "Serve the model behind an OpenAI-compatible API"),
    "trace": ("profiler.commands.trace:trace", "Put a PyTorch profiler trace on the roofline"),
    "counters": ("profiler.commands.counters:counters", "Put Nsight Compute counters on the roofline"),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return sorted(COMMANDS)

    def get_command(self, ctx, name):
        entry = COMMANDS.get(name)
        if entry is None:
            return None
        module, attr = entry[0].split(":")
        return getattr(importlib.import_module(module), attr)

    def format_commands(self, ctx, formatter):
        """The command list from COMMANDS' summaries: whole sentences, and no command module imported."""
        with formatter.section("Commands"):
            formatter.write_dl([(name, COMMANDS[name][1]) for name in self.list_commands(ctx)])

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
