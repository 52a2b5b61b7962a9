"""Issue 30, speed: the default ``roofline trace`` (its report included) carries less fixed cost. No timing is
asserted: what is checked is what was cut -- a report of two or more figure builders draws in two processes where
cores are idle (and in one where the load takes them), and a command that names no URL does not import the
endpoint client (asyncio)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from reports import render

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("cores, load, idle", [(2, 0.0, 2), (2, 1.0, 2), (2, 1.6, 1), (2, 2.3, 1), (2, 3.0, 1),
                                               (16, 0.5, 16), (16, 12.2, 4), (1, 0.0, 1)])
def test_idle_cores_are_the_load_average_off_the_cores(cores, load, idle):
    assert render.idle_cores(cores, load) == idle


def test_a_trace_report_s_figures_draw_in_two_processes_where_two_cores_are_idle(monkeypatch):
    monkeypatch.delenv("ROOFLINE_RENDER_PROCESSES", raising=False)
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.2, 0.2, 0.2))
    assert render._workers(3) == 2 and render._workers(2) == 2      # a trace: roofline, predicted, idle
    assert render._workers(1) == 1
    monkeypatch.setattr(os, "getloadavg", lambda: (2.4, 2.0, 2.0))    # both cores taken: one process
    assert render._workers(3) == 1
    monkeypatch.setenv("ROOFLINE_RENDER_PROCESSES", "1")
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert render._workers(3) == 1


def test_a_command_without_a_url_does_not_import_the_endpoint_client():
    code = ("import sys; import profiler.run as r; r.redact(['trace', 'x.json']); "
            "print('asyncio' in sys.modules, 'profiler.endpoint' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True).stdout.split()
    assert out == ["False", "False"]
    from profiler.run import redact

    assert redact(["latency", "--endpoint", "http://u:secret@h:8000/v1"]) == [
        "latency", "--endpoint", "http://u:[redacted]@h:8000/v1"]
