"""Shared look of every figure: rc settings, colours, markers, figure creation and saving.

Figures are made with ``matplotlib.figure.Figure`` and the Agg canvas directly (no pyplot
state), so rendering is thread-safe and never leaks windows. Colours: one per batch size for a
handful of them (a ramp beyond), a fixed palette for devices, one colour per op of the run's model
(``op_names(model)``: tab20 over ``roofline.layer.op_order([model])``, the ops of the result's ``ModelConfig`` in
the order they run, then the layer op, then any other preset's op names; a result file without a model takes
every preset's order, so its colours are stable too). The plain values (colours, markers, limits) live in
``reports.palette``, which the trace report's own SVG figures share; this module re-exports them.
"""

from __future__ import annotations

import io
from functools import lru_cache
from pathlib import Path

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import LogLocator, NullFormatter

from roofline.layer import LAYER_OP, op_order

from .palette import (ABOVE_ROOF_COLOR, BATCH_CMAP, BATCH_COLORS, CATEGORICAL_BATCHES, CATEGORY_COLORS,  # noqa: F401
                      DATASHEET_COLOR, DEVICE_COLORS, LABEL_ZORDER, MAX_BAR_LABELS, MEASURED_COLOR, MINOR_LOG_SUBS,
                      PHASE_LINESTYLE, PHASE_MARKER, RASTER_ABOVE, TAG_COLORS, TAG_DEFAULT, UNSIZED_COLOR,
                      batch_palette, category_color, device_color, tag_css)

RC = {
    "font.size": 9, "axes.titlesize": 10, "axes.labelsize": 9, "legend.fontsize": 8,
    "xtick.labelsize": 8, "ytick.labelsize": 8, "axes.spines.top": False, "axes.spines.right": False,
    "axes.grid": True, "grid.color": "#e6e6e6", "grid.linewidth": 0.6, "axes.axisbelow": True,
    "svg.fonttype": "path", "svg.hashsalt": "roofline", "figure.dpi": 100, "savefig.dpi": 110,
    "font.family": "DejaVu Sans",
}

_TAB20 = matplotlib.colormaps["tab20"]
_TAB20B = matplotlib.colormaps["tab20b"]
OTHER_OP_COLOR = "#555555"


@lru_cache(maxsize=32)
def op_names(model=None) -> tuple:
    """The op names a run of ``model`` (a ``ModelConfig``; None: unknown) is coloured and ordered by: its own
    ops in the order they run, the layer op, then every other preset op name (see the module docstring)."""
    every = op_order() + (LAYER_OP,)
    if model is None:
        return every
    own = op_order([model]) + (LAYER_OP,)
    return own + tuple(n for n in every if n not in own)


@lru_cache(maxsize=32)
def _op_colors(model=None) -> dict:
    return {name: (_TAB20(i) if i < 20 else _TAB20B(i - 20)) for i, name in enumerate(op_names(model))}


def op_color(op: str, model=None):
    """The colour of ``op`` in a run of ``model`` (``op_names``); grey for a name no model has."""
    return _op_colors(model).get(op, OTHER_OP_COLOR)


def run_model(rf):
    """The ``ModelConfig`` a result file's header records, or None (what ``op_color`` colours by)."""
    return getattr(rf.header, "model", None)


# zlib level of the PNGs: 1 encodes a report figure in about 40% of the default 6's time, for ~6% more bytes
PNG_COMPRESSION = 1


def log_log(ax) -> None:
    """Both axes logarithmic, with unlabelled minor ticks at ``MINOR_LOG_SUBS`` of each decade."""
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_minor_locator(LogLocator(10.0, subs=MINOR_LOG_SUBS))
        axis.set_minor_formatter(NullFormatter())


def new_figure(width: float, height: float, **subplots) -> tuple[Figure, object]:
    """A Figure on an Agg canvas and its axes (``Figure.subplots`` arguments)."""
    with matplotlib.rc_context(RC):
        fig = Figure(figsize=(width, height), layout="constrained")
        FigureCanvasAgg(fig)
        axes = fig.subplots(**subplots) if subplots else fig.add_subplot()
    return fig, axes


def styled(fn):
    """Run a plotting function under the report's rc settings."""
    def wrapper(*args, **kwargs):
        with matplotlib.rc_context(RC):
            return fn(*args, **kwargs)
    wrapper.__name__, wrapper.__doc__, wrapper.__wrapped__ = fn.__name__, fn.__doc__, fn
    return wrapper


def save(fig: Figure, stem: Path, formats=("png", "svg")) -> dict[str, Path]:
    """Write ``stem.png`` and ``stem.svg``; returns {format: path}."""
    out = {}
    freeze_layout(fig)
    with matplotlib.rc_context(RC):
        for fmt in formats:
            p = stem.with_suffix("." + fmt)
            fig.savefig(p, format=fmt, metadata={"Date": None} if fmt == "svg" else None,
                        **({"pil_kwargs": {"compress_level": PNG_COMPRESSION}} if fmt == "png" else {}))
            out[fmt] = p
    return out


def freeze_layout(fig: Figure) -> None:
    """Run the constrained layout once and keep it: every later save reuses the positions
    instead of solving the layout again (it dominates rendering time)."""
    engine = fig.get_layout_engine()
    if engine is not None:
        with matplotlib.rc_context(RC):
            engine.execute(fig)
        # no engine at all, not matplotlib's "none" placeholder: with any engine, each savefig first runs a whole
        # draw (rendering disabled) for it; nothing is left to lay out
        with matplotlib.rc_context({"figure.autolayout": False, "figure.constrained_layout.use": False}):
            fig.set_layout_engine(None)


def svg_bytes(fig: Figure) -> bytes:
    buf = io.BytesIO()
    with matplotlib.rc_context(RC):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    return buf.getvalue()
