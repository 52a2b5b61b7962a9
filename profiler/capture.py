"""Record a trace ``roofline trace`` reads fully, without learning torch.profiler.

    from profiler.capture import capture
    with capture("trace.json.gz", skip_forwards=1) as cap:   # the first forward call is a warm-up
        model.generate(**inputs, max_new_tokens=8)           # each top-level forward is marked
        with cap.phase("prefill"):                            # or mark phases yourself
            ...

    roofline trace --capture --out roofline-trace -- python my_script.py ARGS

The settings: ``record_shapes=True`` (the cost model needs every op's input shapes and
dtypes), CPU and (when visible) CUDA activity, no stacks (they bloat the file and are not
needed), and each top-level ``nn.Module`` call wrapped in a ``record_function("forward")``
range so the forward sequence marks the steps (a global forward hook; nested modules are not
marked). ``skip_forwards=N`` starts recording at the N+1-th top-level forward call, so warm-up
steps (first-call allocations, kernel selection) stay out of the trace. ``cap.phase(name)``
is ``record_function(name)``: "prefill" and "decode" are the names ``roofline trace`` looks
for. A path ending in ``.gz`` is written gzip-compressed.

``python -m profiler.capture --out TRACE [--skip-forwards N] -- SCRIPT ARGS`` runs a script
under ``capture`` (what ``roofline trace --capture`` runs, in this Python).
"""

from __future__ import annotations

import contextlib
import gzip
import os
import runpy
import shutil
import sys
import tempfile
from pathlib import Path


class capture:
    """A context manager that records a shapes-on torch.profiler trace to ``path`` (see the module docstring)."""

    def __init__(self, path, *, skip_forwards: int = 0, mark_forwards: bool = True, cuda: bool | None = None):
        import torch

        self.path = Path(path)
        self.skip = max(int(skip_forwards), 0)
        self.mark = bool(mark_forwards)
        self.cuda = torch.cuda.is_available() if cuda is None else bool(cuda)
        self.forwards = 0          # top-level forward calls seen (recorded or skipped)
        self._depth = 0
        self._ranges: list = []
        self._hooks: list = []
        self._prof = None
        self._started = False

    # ---- the profiler
    def _start(self):
        if not self._started:
            self._prof.start()
            self._started = True

    def __enter__(self):
        import torch
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        self._prof = profile(activities=acts, record_shapes=True, with_stack=False, profile_memory=False)
        if self.mark or self.skip:
            mod = torch.nn.modules.module
            self._hooks = [mod.register_module_forward_pre_hook(self._pre),
                           mod.register_module_forward_hook(self._post)]
        if self.skip == 0:
            self._start()
        return self

    def _pre(self, module, args):
        if self._depth == 0:
            if self.forwards == self.skip:
                self._start()
            self.forwards += 1
            if self._started and self.mark:
                from torch.autograd.profiler import record_function

                r = record_function(f"forward#{self.forwards - self.skip}")
                r.__enter__()
                self._ranges.append(r)
        self._depth += 1

    def _post(self, module, args, out):
        self._depth = max(self._depth - 1, 0)
        if self._depth == 0 and self._ranges:
            self._ranges.pop().__exit__(None, None, None)

    def phase(self, name: str):
        """A ``record_function(name)`` range: "prefill" / "decode" mark the phases for ``roofline trace``."""
        from torch.autograd.profiler import record_function

        return record_function(name)

    def __exit__(self, *exc):
        for h in self._hooks:
            h.remove()
        while self._ranges:
            self._ranges.pop().__exit__(None, None, None)
        if not self._started:
            self._start()      # nothing ran past the warm-up: write an empty trace rather than none
        self._prof.stop()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.name.endswith(".gz"):
            with tempfile.TemporaryDirectory() as tmp:
                raw = Path(tmp) / "trace.json"
                self._prof.export_chrome_trace(str(raw))
                with open(raw, "rb") as src, gzip.open(self.path, "wb", compresslevel=6) as dst:
                    shutil.copyfileobj(src, dst)
        else:
            self._prof.export_chrome_trace(str(self.path))
        return False


USAGE = "--capture runs a Python script: `roofline trace --capture -- python SCRIPT.py ARGS`"
NOT_SCRIPTS = (".json", ".gz", ".jsonl", ".csv", ".safetensors")


def script_argv(cmd: list) -> list:
    """``cmd`` as [script.py, args...]: a leading ``python`` (``-- python script.py``) is dropped."""
    if cmd and Path(cmd[0]).name.startswith("python") and not cmd[0].endswith(".py"):
        return list(cmd[1:])      # the script runs in this interpreter
    return list(cmd)


def script_problem(script) -> str | None:
    """Why ``script`` cannot run under ``--capture`` (one line naming it), or None when it can."""
    path = Path(script)
    if not path.exists():
        return f"{script} does not exist; {USAGE}."
    if path.is_dir():
        return f"{script} is a folder, not a Python script; {USAGE}."
    with open(path, "rb") as f:
        head = f.read(4096)
    if path.name.lower().endswith(NOT_SCRIPTS) or b"\0" in head or head[:2] == b"\x1f\x8b":
        return (f"{script} is not a Python script (a trace or other data file); {USAGE}. To read a trace, "
                f"give it without --capture; a CUDA-graph capture trace goes to --capture-trace FILE.")
    return None


def run_script(out, argv, *, skip_forwards: int = 0) -> int:
    """Run ``argv`` ([script.py, args...]) as __main__ under ``capture(out)``; returns its exit status.

    A ``SystemExit`` with a message (``sys.exit("boom")``) prints that message to stderr, as Python does."""
    script = argv[0]
    problem = script_problem(script)
    if problem:
        print(f"Error: {problem}", file=sys.stderr)
        return 2
    old = sys.argv
    sys.argv = list(argv)
    sys.path.insert(0, str(Path(script).resolve().parent))
    status, said = 0, None
    try:
        with capture(out, skip_forwards=skip_forwards):
            try:
                runpy.run_path(script, run_name="__main__")
            except SystemExit as e:
                status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                said = None if e.code is None or isinstance(e.code, int) else e.code
    finally:
        sys.argv = old
    if said is not None:
        print(said, file=sys.stderr)      # after the profiler's own notes: the last line the caller sees
    return status


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        print("usage: python -m profiler.capture --out TRACE [--skip-forwards N] -- SCRIPT.py ARGS", file=sys.stderr)
        return 2
    i = argv.index("--")
    opts, cmd = argv[:i], argv[i + 1:]
    out, skip = None, 0
    with contextlib.suppress(ValueError, IndexError):
        out = opts[opts.index("--out") + 1]
    with contextlib.suppress(ValueError, IndexError):
        skip = int(opts[opts.index("--skip-forwards") + 1])
    if not out or not cmd:
        print("usage: python -m profiler.capture --out TRACE [--skip-forwards N] -- SCRIPT.py ARGS", file=sys.stderr)
        return 2
    cmd = script_argv(cmd)
    if not cmd:
        print(f"Error: no script after `python`; {USAGE}.", file=sys.stderr)
        return 2
    if cmd[0] == "-m":
        print("Error: --capture runs a script file (python SCRIPT.py ARGS), not a module (-m).", file=sys.stderr)
        return 2
    os.environ.setdefault("ROOFLINE_CAPTURE", str(out))
    return run_script(out, cmd, skip_forwards=skip)


if __name__ == "__main__":  # pragma: no cover - exercised through `roofline trace --capture`
    sys.exit(main())
