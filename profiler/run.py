"""Orchestration in the library: what every run shares, and the runs themselves (re-exported here).

    from profiler.run import RunSpec, default_plan, run_profile        # profiler.run_spec, profiler.profile_run
    from profiler.run import LatencyRun, run_latency                   # profiler.latency_run

Shared here: ``Interrupted`` (Ctrl-C after the file is closed, with the command that resumes
it), the one recorded command line (``command_line``, secrets such as ``--api-key`` redacted), the
``roofline`` a printed command starts with (``entry_point``: this environment's own), the CPU threads a
serving run defaults to (``cpu_threads_default``),
``check_writable`` (the output folder, before any work), ``remove_derived`` (a report or CSV
made from an older file), ``run_configs`` (latency and endpoint runs: the one writer, resume
by configuration, one attempt per configuration, a ``host-load`` record per configuration: how
busy the host was), ``strict_json`` (stdout JSON without NaN).
"""

from __future__ import annotations

import importlib
import json
import os
import shlex
import shutil
import sys
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

from roofline.errors import RooflineError
from roofline.latency import FORMULAS, latency_runs
from roofline.records import RunHeader, read_results, strict
from roofline.writer import ResultWriter

from . import probes


DERIVED = ("report.html", "report.md", "results.csv", "figures", ".report-sources.json")   # made from results.jsonl: stale when it changes


MODES = ("new", "resume", "overwrite")


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a run: the file is closed and holds every finished record; ``resume`` continues it."""

    def __init__(self, path: Path, kept: int, resume: str, what: str = "points"):
        super().__init__(f"interrupted: {kept} {what} are kept in {path}")
        self.path, self.kept, self.resume, self.what = path, kept, resume, what

    @property
    def message(self) -> str:
        return f"interrupted: {self.kept} {self.what} are kept in {self.path}. Resume with:\n  {self.resume}"


def quiet(msg: str) -> None:
    """The default ``say``: notes go nowhere."""


SECRET_OPTIONS = ("--api-key",)   # their values never reach a result file or a printed command


def redact(args) -> list:
    """``args`` with the value of every ``SECRET_OPTIONS`` option replaced by ``***``, and every URL's password and
    credential query values (``endpoint.public_url``) by ``[redacted]``."""
    out, hide, args = [], False, list(args)
    if any("://" in str(a) for a in args):
        from .endpoint import public_url     # asyncio and the HTTP client: only for a command that names a URL
        args = [public_url(a) if "://" in str(a) else a for a in args]
    for a in args:
        if hide:
            out.append("***")
            hide = False
        elif a in SECRET_OPTIONS:
            out.append(a)
            hide = True
        elif any(a.startswith(o + "=") for o in SECRET_OPTIONS):
            out.append(a.split("=", 1)[0] + "=***")
        else:
            out.append(a)
    return out


def command_line(equivalent: str) -> str:
    """The one recorded command line: as typed when run as ``roofline`` (secrets redacted), else the equivalent."""
    if sys.argv and Path(sys.argv[0]).name == "roofline":
        return shlex.join(["roofline", *redact(sys.argv[1:])])
    return equivalent


def entry_point() -> str:
    """The ``roofline`` a printed command starts with: the one this process runs as, else this environment's own
    (the script beside its Python, e.g. a virtual environment's bin/roofline), else a bare ``roofline``."""
    if sys.argv and Path(sys.argv[0]).name == "roofline":
        return str(Path(sys.argv[0]).absolute())
    here = Path(sys.executable).parent / "roofline"
    return str(here) if here.is_file() else "roofline"


def cpu_threads_default(device: str, threads: int | None) -> int | None:
    """On a CPU, one thread fewer than the cores: torch's OpenMP threads spin-wait, and with every
    core busy one other process stretches each step many times over (3 s -> 25 s on 2 cores)."""
    if threads is None and device == "cpu":
        return max(1, (os.cpu_count() or 2) - 1)
    return threads


def started() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def check_writable(out: Path) -> None:
    """RooflineError unless ``out`` is a folder this process can create files in (checked before any work)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".roofline-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise RooflineError(f"--out {out}: the output folder cannot be written ({e.strerror or e}); give a folder "
                            "you can write to.") from None


def remove_derived(out: Path, names=DERIVED, source: Path | None = None) -> None:
    """Delete outputs made from an older result file (a report, a CSV): they would describe other data.

    With ``source`` (the file this run rewrites), a report (report.html, report.md, figures/) goes only
    when its ``reports.SOURCES_FILE`` names that file: a latency run never deletes the report a profile
    wrote into the same folder. A report with no record of its sources is kept then.
    """
    if source is not None and not _made_from(out, Path(source)):
        names = [n for n in names if n not in REPORT_FILES]
    for n in names:
        p = out / n
        try:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()
        except OSError as e:
            raise RooflineError(f"cannot remove the stale {p} ({e.strerror or e}); remove it by hand.") from None


REPORT_FILES = ("report.html", "report.md", "figures", ".report-sources.json")


def _made_from(out: Path, source: Path) -> bool:
    """Whether the report in ``out`` records ``source`` among the result files it was made from."""
    try:
        made = json.loads((out / REPORT_FILES[-1]).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(made, list) and str(source.resolve()) in made


def check_output(run) -> None:
    """A run dataclass's ``out`` as a Path and its ``mode`` checked (call from ``__post_init__``)."""
    object.__setattr__(run, "out", Path(run.out))
    if run.mode not in MODES:
        raise RooflineError(f"mode must be one of {', '.join(MODES)}, not {run.mode!r}.")


@dataclass
class LatencyResult:
    path: Path
    summaries: list               # LatencySummary per configuration run now, in order
    skipped: list = field(default_factory=list)   # configurations already complete in the file (resume)
    result_file: object = None

    def to_json(self) -> dict:
        formulas = self.summaries[0].formulas if self.summaries else FORMULAS
        return {"file": str(self.path), "formulas": list(formulas), "summaries": [s.to_dict() for s in self.summaries],
                "skipped": self.skipped}


class ConfigSink:
    """What a configuration's runner writes through: ``request(timeline)`` the moment a request finishes,
    ``record(dict)`` for any other line; both stamped with the configuration's attempt number."""

    def __init__(self, writer, attempt: int, counter: list):
        self.writer, self.attempt, self._n = writer, attempt, counter

    def request(self, t) -> None:
        self.writer.write(replace(t, attempt=self.attempt))
        self._n[0] += 1

    def record(self, d: dict) -> None:
        self.writer.write({**d, "attempt": self.attempt})


def run_configs(path: Path, mode: str, header: RunHeader, labels: list, run_one, *, say=quiet, resume,
                prepare=None) -> LatencyResult:
    """The part every latency run shares (in-process loop, endpoint client): one file, resumed by configuration.

    Opens ``path`` with the one writer in ``mode``, refuses a resume whose header differs, skips
    the configurations already complete in the file (a resumed one runs again as the next
    attempt), calls ``prepare(todo labels)`` before the header is written (build what the run
    needs: nothing is written when it fails), then ``run_one(label, sink)`` per configuration,
    which writes each request through ``sink.request`` as it finishes and returns the
    ``LatencySummary``. Ctrl-C raises ``Interrupted`` after the file is closed, with
    ``resume()`` as the command that continues it.
    """
    writer = ResultWriter(path, mode=mode)
    summaries, skipped, written = [], [], [0]
    try:
        if writer.repaired_bytes:
            say(f"note: the last line of {path} was cut off ({writer.repaired_bytes} bytes): removed before resuming.")
        writer.check(header)
        attempts, complete = {}, set()
        if writer.old is not None:
            for t in writer.old.requests:
                attempts[t.config] = max(attempts.get(t.config, 0), t.attempt)
            for s in writer.old.summaries:
                attempts[s.config] = max(attempts.get(s.config, 0), s.attempt)
            complete = {r.config for r in latency_runs(writer.old) if r.complete}
        todo = [label for label in labels if label not in complete]
        skipped = [label for label in labels if label in complete]
        if skipped:
            say(f"resuming: {len(skipped)} configuration(s) already complete in {path}: {', '.join(skipped)}")
        if prepare is not None:
            prepare(todo)
        writer.begin(header)
        remove_derived(path.parent, REPORT_FILES, source=path)   # only a report made from this file
        for label in todo:
            sink = ConfigSink(writer, attempts.get(label, 0) + 1, written)
            before = probes.CpuProbe().sample()
            s = replace(run_one(label, sink), attempt=sink.attempt)
            sink.record(host_load(label, before, probes.CpuProbe().sample()))
            writer.write(s)
            summaries.append(s)
    except KeyboardInterrupt:
        writer.close()
        raise Interrupted(path, written[0], resume(), what="requests") from None
    finally:
        writer.close()
    return LatencyResult(path, summaries, skipped, read_results(path))


def host_load(label: str, before: dict, after: dict) -> dict:
    """A ``host-load`` record: how busy the host was while configuration ``label`` ran (``probes`` samples around it).

    ``others_share``: the machine's CPU time other processes took; ``busy`` when over ``probes.OTHERS_BUSY``.
    ``roofline.analysis`` reads these records: a latency run with busy configurations says so first.
    """
    share = probes.others_share(before, after)
    return {"type": "host-load", "config": label, "others_share": round(share, 4),
            "loadavg_1m": after.get("loadavg_1m"), "usable_cpus": after.get("usable_cpus"),
            "busy": share > probes.OTHERS_BUSY}


def strict_json(obj) -> str:
    """JSON for stdout: strict (NaN and infinities as null), as every JSON parser expects."""
    return json.dumps(strict(obj), allow_nan=False)




# The runs themselves, importable from here. Looked up when first asked for (PEP 562): their modules
# import the shared pieces above, and a rank process that unpickles one of them first must not
# find this module half-initialized.
_EXPORTS = {"validate_kernels": "kernel_checks",
            **dict.fromkeys(("LatencyRun", "config_label", "run_latency"), "latency_run"),
            **dict.fromkeys(("BUDGET_MS", "CPU_DEFAULTS", "CPU_QUICK", "GPU_DEFAULTS", "GPU_QUICK", "RunSpec",
                             "default_plan"), "run_spec"),
            **dict.fromkeys(("ProfileResult", "run_profile"), "profile_run")}


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'profiler.run' has no attribute {name!r}")
    return getattr(importlib.import_module(f"profiler.{module}"), name)
