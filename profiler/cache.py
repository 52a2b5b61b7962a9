"""What a run remembers between runs: small JSON files under ``$ROOFLINE_CACHE_DIR`` (default
``~/.cache/roofline``), each holding the key it was made for.

Measured ceilings, collective bandwidths, a kernel check's pass and the FLOP cross-check are
each stored as ``{"key": key, ...}`` at ``path(name, key)``; ``load`` returns the document only
when its key matches the one asked for (a missing, corrupt or stale file is a miss), and
``store`` writes atomically and never fails a run (an unwritable cache only costs the work again).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path


def cache_dir() -> Path:
    return Path(os.environ.get("ROOFLINE_CACHE_DIR") or Path.home() / ".cache" / "roofline")


def slug(text: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3' (for readable file names)."""
    return re.sub(r"[^a-z0-9]+", "-", str(text).lower()).strip("-")[:40]


def path(name: str, key: dict, digits: int = 10) -> Path:
    """``name-<hash of key>.json`` in the cache folder (``name`` may carry a device slug)."""
    h = hashlib.sha1(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:digits]
    return cache_dir() / f"{name}-{h}.json"


def load(p: Path, key: dict) -> dict | None:
    """The document at ``p`` when it was stored for ``key``; None otherwise."""
    try:
        d = json.loads(p.read_text())
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) and d.get("key") == key else None


def store(p: Path, key: dict, body: dict, *, indent: int | None = None) -> None:
    """Write ``{"key": key, **body}`` to ``p`` (via a temporary file, so a reader never sees half of it)."""
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_suffix(".tmp")
        tmp.write_text(json.dumps({"key": key, **body}, indent=indent, default=str))
        tmp.replace(p)
    except OSError:
        pass
