"""Draw and save a report's figures, in two processes where the machine allows (rendering only).

Matplotlib draws in one thread, and a report's figures are independent: on a machine with
several cores, ``render(jobs, folder)`` forks worker processes that build and save a share of
the figures each (PNG and SVG, or the formats a job names), returning only their titles, captions,
paths and hover marks (``reports.hover``: where each explained point sits in the SVG). The workers
inherit the analysed result files through ``fork`` (nothing is pickled but indices); they run
matplotlib only. Where ``fork`` is unavailable (not Linux), with one core (or one left idle by the
load: ``idle_cores``), for fewer than
``PARALLEL_FROM`` builders (two), or if the pool cannot start, the figures are drawn here, one after
another: the same files either way.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
from pathlib import Path

from . import hover
from .report_figure import Drawn
from .style import save

PARALLEL_FROM = 2     # one builder: nothing to share. A trace's 3 figures, 2 cores at load 1-1.9: run_trace 0.79-1.16 s
                      # in two processes against 1.28-1.45 s in one (fork after matplotlib is imported: ~30 ms)
WORKERS = 2          # at most; ROOFLINE_RENDER_PROCESSES sets it (1: draw here, e.g. when the cores are taken)

FORMATS = ("png", "svg")   # what a job writes unless it says (a third item: e.g. ("png",) beside our own SVG)
_JOBS: list = []      # (stem prefix, build[, formats]) set before forking; the workers index into it


def _draw(i: int, folder: str) -> list:
    prefix, build, formats = (_JOBS[i] + (FORMATS,))[:3]
    out = []
    for fig in build():
        paths = save(fig.figure, Path(folder) / f"{prefix}{fig.key}", formats)
        marks = tuple(hover.marks(fig.figure)) if "svg" in formats else ()   # the layout is final once saved
        fig.figure.clear()
        out.append((Drawn(fig.key, fig.title, fig.caption, marks), {k: str(v) for k, v in paths.items()}))
    return out


def _workers(n_jobs: int) -> int:
    if n_jobs < PARALLEL_FROM or not sys.platform.startswith("linux"):
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        wanted = int(os.environ.get("ROOFLINE_RENDER_PROCESSES", WORKERS))
    except ValueError:
        wanted = WORKERS
    return max(1, min(wanted, cores, idle_cores(cores)))


def idle_cores(cores: int, load=None) -> int:
    """Cores the other processes leave free (the 1-minute load average off the cores, rounded up): a second
    drawing process on a machine whose cores are all taken only queues behind them (measured on a 2-core box at
    load 2.3-3: a trace report 2.66 s median in two processes, 2.06 s in one)."""
    if load is None:
        try:
            load = os.getloadavg()[0]
        except (OSError, AttributeError):
            return cores
    return max(1, min(cores, int(cores - load + 1)))


def render(jobs, folder: Path) -> list:
    """``jobs``: [(stem prefix, build[, formats])] -> per job, [(Drawn, {fmt: Path})] in job order."""
    global _JOBS
    _JOBS = list(jobs)
    try:
        n = _workers(len(_JOBS))
        done = None
        if n > 1:
            try:
                with mp.get_context("fork").Pool(n) as pool:
                    done = pool.starmap(_draw, [(i, str(folder)) for i in range(len(_JOBS))], chunksize=1)
            except OSError:
                done = None          # no processes to be had (limits): draw here instead
        if done is None:
            done = [_draw(i, str(folder)) for i in range(len(_JOBS))]
        return [[(d, {k: Path(v) for k, v in paths.items()}) for d, paths in figs] for figs in done]
    finally:
        _JOBS = []
