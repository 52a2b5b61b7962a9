"""compare.json: what `roofline compare` writes, and the comparison read back from it (pure).

``comparison_dict(c, findings, out, across_models)`` is the file's content: its format, the two
result files (absolute, and relative to the output folder, so a moved folder still finds them),
the change under test, every step and flagged op with its speed-up and range, latency
percentiles and the findings. ``read_comparison(path)`` does not trust those numbers: it reads
the two result files again and compares them (one reading of result files, one comparison), so
``roofline diagnose compare.json`` always says what the files say today.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import RooflineError
from ..records import read_results, strict
from .comparison import compare

FORMAT = "roofline-compare"
FORMAT_VERSION = 1


def comparison_dict(c, findings, out: Path, across_models: bool) -> dict:
    """What compare.json holds: the files, the change, every step and flagged op, latency, findings."""
    def where(p):
        p = Path(p).resolve()
        return {"path": str(p), "relative": os.path.relpath(p, out.resolve())}

    def change(ch):
        lo, hi = ch.interval
        return {"before_s": ch.before, "after_s": ch.after, "speedup": ch.speedup, "range": [lo, hi],
                "saved_s": ch.saved, "verdict": c.verdict_of(ch)}
    return strict({
        "format": FORMAT, "version": FORMAT_VERSION, "before": where(c.before.rf.path),
        "after": where(c.after.rf.path), "across_models": across_models,
        "changed": {k: list(v) for k, v in c.changed.items()},
        "settings_changed": {k: list(v) for k, v in c.settings.items()}, "notes": list(c.notes),
        "steps": [{"step": s.title, "backend": s.after.backend, **change(s.time), "comparable": s.comparable,
                   "bytes_ratio": s.bytes_ratio, "predicted_speedup": s.predicted_speedup} for s in c.steps],
        "flagged_ops": [{"op": o.title, **change(o.time)} for o in c.flagged],
        "matched_ops": len(c.ops), "only_before": len(c.only_before), "only_after": len(c.only_after),
        "skipped": len(c.skipped),
        "latency": [{"config": x.config, "metric": x.metric, "percentile": x.pct, **change(x.change)}
                    for x in c.latency],
        "findings": [f.to_dict() for f in findings],
    })


def read_comparison(path, *, across_models: bool | None = None):
    """The comparison a compare.json describes, recomputed from its two result files (one reading)."""
    p = Path(path)
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RooflineError(f"cannot read the compare result {p}: {e}.") from None
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise RooflineError(f"{p} is not a `roofline compare` result (no '{FORMAT}' format field).")
    files = []
    for side in ("before", "after"):
        w = d.get(side) or {}
        cands = [Path(w.get("path", "")), p.parent / w.get("relative", "")]
        found = next((x for x in cands if str(x) and x.is_file()), None)
        if found is None:
            raise RooflineError(f"{p}: its {side} file {w.get('path')} is gone (not at {cands[1]} either): "
                                "compare the two result files again, or give them to diagnose with --baseline.")
        files.append(read_results(found))
    allow = bool(d.get("across_models")) if across_models is None else across_models
    return compare(files[0], files[1], across_models=allow)


def is_compare_file(path) -> bool:
    """Does ``path`` start like a compare.json (a JSON object with the compare format)?"""
    try:
        with open(path, "rb") as f:
            head = f.read(200)
    except OSError:
        return False
    return head.lstrip().startswith(b"{") and FORMAT.encode() in head
