"""Figures of a latency run (``roofline latency``): request timelines, TTFT / ITL distributions, chunk trade-off.

Each plot function takes an ``ax`` and returns it; ``latency_section(result_file)`` builds the
figures for ``reports.write_report`` as ``(title, Figure, caption)`` tuples::

    from roofline.records import read_results
    from reports.latency_figures import latency_section
    for title, fig, caption in latency_section(read_results("roofline-out/latency.jsonl")):
        fig.savefig(title.replace(" ", "_") + ".png")

Numbers come from ``roofline.latency`` (timelines and summaries), never computed here.
"""

from __future__ import annotations

import math

from roofline.latency import FORMULAS, latency_runs
from roofline.units import ms

from .style import new_figure, styled

QUEUE_COLOR, PREFILL_COLOR, DECODE_COLOR, FIRST_COLOR = "#bbbbbb", "#ff7f0e", "#1f77b4", "#d62728"
MS = 1e3


@styled
def plot_request_timeline(ax, timelines, title: str = ""):
    """One row per request: queue (grey), prefill chunks (orange), decode (blue) with a tick per
    delivered token, the first token marked (red diamond). x: ms since the run started. A request
    measured from a client (``sent`` set) has no chunks: its grey bar is the client's wait for a
    concurrency slot, and sent -> first token is left blank (the server's queue and prefill)."""
    for row, t in enumerate(sorted(timelines, key=lambda t: (t.arrival, t.id))):
        start = t.chunks[0][0] if t.chunks else (t.finish if math.isnan(t.sent) else t.sent)
        if not math.isnan(start):
            ax.broken_barh([(t.arrival * MS, (start - t.arrival) * MS)], (row - 0.3, 0.6), color=QUEUE_COLOR,
                           label="queue" if row == 0 else None)
        ax.broken_barh([(s * MS, (e - s) * MS) for s, e, _ in t.chunks], (row - 0.3, 0.6), facecolor=PREFILL_COLOR,
                       edgecolor="white", linewidth=0.4, label="prefill chunk" if row == 0 else None)
        if t.deliveries:
            first = t.deliveries[0]
            ax.broken_barh([(first * MS, (t.finish - first) * MS)], (row - 0.15, 0.3), color=DECODE_COLOR,
                           alpha=0.5, label="decode" if row == 0 else None)
            ax.plot([d * MS for d in t.deliveries], [row] * t.n, "|", color=DECODE_COLOR, ms=6)
            ax.plot([first * MS], [row], "D", color=FIRST_COLOR, ms=4, label="first token" if row == 0 else None)
        if not t.ok:
            ax.text(t.finish * MS, row, "  failed", va="center", color=FIRST_COLOR, fontsize=7)
    n = len(timelines)
    ax.set_yticks(range(n), [f"req {t.id}" for t in sorted(timelines, key=lambda t: (t.arrival, t.id))])
    ax.set_ylim(n - 0.5, -0.5)
    ax.set_xlabel("time since start (ms)")
    if title:
        ax.set_title(title)
    return ax


@styled
def plot_distribution(ax, values: dict, metric: str = "TTFT"):
    """Empirical CDF of ``metric`` per configuration; ``values``: label -> seconds."""
    for label, xs in values.items():
        xs = sorted(x * MS for x in xs if not math.isnan(x))
        if xs:
            ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", label=label)
    ax.set_xlabel(f"{metric} (ms)")
    ax.set_ylabel("fraction of " + ("requests" if metric != "ITL" else "gaps"))
    ax.set_ylim(0, 1.02)
    ax.set_title(metric)
    return ax


def _budget_label(b) -> str:
    return "none" if b in (None, "none") else str(b)


@styled
def plot_chunk_tradeoff(ax, summaries):
    """TTFT p90 and ITL p99 (ms) against the chunk budget, one line each (prefix cache per line style).

    x is categorical in budget order with "none" (whole prompts) last."""
    groups = {}
    for s in summaries:
        groups.setdefault(bool(s.settings.get("prefix_cache")), []).append(s)
    budgets = sorted({_budget_label(s.settings.get("chunk_budget")) for s in summaries},
                     key=lambda b: math.inf if b == "none" else int(b))
    pos = {b: i for i, b in enumerate(budgets)}
    for cache, ss in sorted(groups.items()):
        ss = sorted(ss, key=lambda s: pos[_budget_label(s.settings.get("chunk_budget"))])
        x = [pos[_budget_label(s.settings.get("chunk_budget"))] for s in ss]
        style = "-" if cache else "--"
        tag = f" (prefix cache {'on' if cache else 'off'})" if len(groups) > 1 else ""
        ax.plot(x, [s.ttft["p90"] * MS for s in ss], style, marker="o", color=PREFILL_COLOR, label="TTFT p90" + tag)
        ax.plot(x, [s.itl["p99"] * MS for s in ss], style, marker="s", color=DECODE_COLOR, label="ITL p99" + tag)
    ax.set_xticks(range(len(budgets)), budgets)
    ax.set_xlabel("chunk budget (tokens per step)")
    ax.set_ylabel("ms")
    ax.set_yscale("log")
    ax.set_title("Chunk budget: first token vs stalls")
    ax.legend()
    return ax


SUMMARY_COLUMNS = ("configuration", "TTFT p50", "TTFT p90", "TTFT p99", "TPOT p50", "TPOT p90", "ITL p50",
                   "ITL p99", "E2E p50", "goodput", "failed")


def summary_rows(summaries) -> list:
    """One row of strings per configuration, in SUMMARY_COLUMNS order (times in ms)."""
    f = lambda x: "n/a" if x is None or math.isnan(x) else ms(x).removesuffix(" ms")  # noqa: E731
    rows = []
    for s in summaries:
        g = "n/a" if math.isnan(s.goodput_rps) else f"{s.goodput_rps:.2f}/s ({s.met_slo}/{s.requests})"
        rows.append([s.config, f(s.ttft.get("p50")), f(s.ttft.get("p90")), f(s.ttft.get("p99")), f(s.tpot.get("p50")),
                     f(s.tpot.get("p90")), f(s.itl.get("p50")), f(s.itl.get("p99")), f(s.e2e.get("p50")), g,
                     str(s.failed)])
    return rows


@styled
def plot_summary_table(ax, summaries):
    """The per-configuration numbers as a table (ms), with no axes."""
    ax.axis("off")
    tab = ax.table(cellText=summary_rows(summaries), colLabels=SUMMARY_COLUMNS, loc="center", cellLoc="right")
    tab.auto_set_font_size(False)
    tab.set_fontsize(7)
    tab.auto_set_column_width(list(range(len(SUMMARY_COLUMNS))))
    return ax


def latency_section(result_file) -> list:
    """[(title, Figure, caption)] for a kind="latency" result file."""
    runs = latency_runs(result_file)
    if not runs:
        return []
    groups = {r.config: (list(r.timelines), r.summary) for r in runs}
    summaries = [r.summary for r in runs]
    fig, ax = new_figure(9.0, 0.6 + 0.25 * len(summaries))
    plot_summary_table(ax, summaries)
    slo = summaries[0].slo
    out = [("Latency summary", fig,
            "Milliseconds per configuration. " + "; ".join(FORMULAS) + ". Goodput counts requests meeting every SLO "
            + ("(" + ", ".join(f"{k} <= {v * MS:g} ms" for k, v in slo.items()) + ")" if slo else "(none given: "
               "every completed request counts)") + "; failed requests stay in the counts. Timestamps are taken "
            "after a device sync; arrival is the scheduled time.")]
    labels = list(groups)
    shown = labels[:6]
    fig, axes = new_figure(7.5, 1.2 + 0.35 * sum(len(groups[c][0]) for c in shown) + 0.6 * len(shown),
                           nrows=len(shown), ncols=1, squeeze=False)
    for ax, cfg in zip(axes[:, 0], shown):
        plot_request_timeline(ax, groups[cfg][0], title=cfg)
    fig.legend(*axes[0, 0].get_legend_handles_labels(), loc="outside upper center", ncol=4)
    more = f" (the first {len(shown)} of {len(labels)} configurations)" if len(shown) < len(labels) else ""
    out.append(("Request timelines", fig,
                "Each request from arrival to its last token" + more + ": grey = queue (tokenization and waiting, "
                "arrival to the first prefill chunk), orange = prefill chunks, blue = decode with a tick per delivered "
                "token, red diamond = first token delivered. Timestamps are taken after a device sync; an orange "
                "chunk of one request above a wide gap in another's ticks is a stall."))
    fig, (a1, a2) = new_figure(7.5, 3.0, ncols=2)
    plot_distribution(a1, {c: [t.ttft for t in ts if t.ok] for c, (ts, _) in groups.items()}, "TTFT")
    plot_distribution(a2, {c: [g for t in ts if t.ok for g in t.itls] for c, (ts, _) in groups.items()}, "ITL")
    a2.legend(fontsize=7)
    out.append(("TTFT and ITL distributions", fig,
                "Empirical CDFs per configuration. " + FORMULAS[0] + "; " + FORMULAS[2] + "."))
    if len({_budget_label(s.settings.get("chunk_budget")) for s in summaries}) > 1:
        fig, ax = new_figure(6.0, 3.2)
        plot_chunk_tradeoff(ax, summaries)
        out.append(("Chunk-budget trade-off", fig,
                    "A larger token budget per step lets a long prompt finish prefill sooner (TTFT falls) but freezes "
                    "running streams for longer while it runs (ITL p99 rises); 'none' prefills whole prompts."))
    return out
