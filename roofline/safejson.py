"""The one validated-JSON reader for input written by others, with size and depth limits.

Every boundary where someone else's JSON enters goes through ``loads`` with its own limits:

    HTTP_BODY   a request body to ``roofline serve``        (``profiler.server``)
    SSE_EVENT   one ``data:`` event from a served model     (``profiler.endpoint``)
    HTTP_REPLY  a JSON answer (/v1/models, /tokenize, errors) (``profiler.endpoint``)
    TRACE_FILE  a profiler trace                            (``roofline.traces.events``)

``loads`` never raises anything but ``BadJSON`` (a ``RooflineError`` whose message is one line
naming what was wrong and the limit): not ``RecursionError`` for ``[[[[...`` nested 100,000
deep, not ``UnicodeDecodeError``, not ``MemoryError`` for an oversized body. A lone surrogate
(``"\\ud800"``, valid JSON that no UTF-8 encoder accepts) is refused where ``text=True``.

The field readers (``finite``, ``whole``, ``text``) validate a value where it is read: they
return it, or ``None`` when it has the wrong type or is not finite (NaN, Infinity), so a
caller skips and counts the bad record instead of carrying NaN into a result file.

>>> loads('{"a": [1, 2]}', limits=HTTP_BODY)
{'a': [1, 2]}
>>> loads('[' * 100000, limits=SSE_EVENT)
Traceback (most recent call last):
...
roofline.safejson.BadJSON: the event is nested deeper than 32 levels (a JSON document of at most 32 is read).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from .errors import RooflineError


class BadJSON(RooflineError):
    """Input JSON that is malformed or breaks a limit; the message names which."""


@dataclass(frozen=True)
class Limits:
    what: str             # how the message names the input: "the request body", "the event", ...
    max_bytes: int | None
    max_depth: int | None  # None: no walk over the whole document (a trace: its fields are checked when read)
    text: bool = True     # refuse strings that cannot be encoded as UTF-8 (lone surrogates)


HTTP_BODY = Limits("the request body", 8 << 20, 32)
SSE_EVENT = Limits("the event", 1 << 20, 32)
HTTP_REPLY = Limits("the answer", 4 << 20, 32)
TRACE_FILE = Limits("the trace", None, None, text=False)


def loads(data, *, limits: Limits):
    """The JSON value in ``data`` (str or bytes) within ``limits``; ``BadJSON`` for anything else."""
    what = limits.what
    if limits.max_bytes is not None and len(data) > limits.max_bytes:
        raise BadJSON(f"{what} is {len(data):,} bytes; at most {limits.max_bytes:,} are read.")
    try:
        doc = json.loads(data)
    except RecursionError:
        raise BadJSON(f"{what} is nested deeper than {limits.max_depth or 'any JSON reader allows'} levels "
                      f"(a JSON document of at most {limits.max_depth or 'a few hundred'} is read).") from None
    except UnicodeDecodeError:
        raise BadJSON(f"{what} is not UTF-8 text.") from None
    except json.JSONDecodeError as e:
        cut = e.pos >= len(data.rstrip()) - 1
        raise BadJSON(f"{what} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})"
                      + ("; it ends early, so it was probably cut off while being written." if cut else ".")) from None
    except (ValueError, TypeError) as e:
        raise BadJSON(f"{what} is not valid JSON ({e}).") from None
    if limits.max_depth is not None:
        check(doc, limits)
    return doc


def check(doc, limits: Limits) -> None:
    """Walk ``doc`` without recursion: no deeper than ``limits.max_depth``; strings UTF-8 encodable when ``text``."""
    stack = [(doc, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, str):
            if limits.text and not _utf8(v):
                raise BadJSON(f"{limits.what} holds a string with a lone surrogate ({_first_surrogate(v)}): only "
                              "text that encodes as UTF-8 is read.")
            continue
        if not isinstance(v, (dict, list)):
            continue
        if depth > limits.max_depth:
            raise BadJSON(f"{limits.what} is nested deeper than {limits.max_depth} levels (a JSON document of at "
                          f"most {limits.max_depth} is read).")
        items = v.items() if isinstance(v, dict) else enumerate(v)
        for k, x in items:
            if isinstance(k, str):
                stack.append((k, depth))
            stack.append((x, depth + 1))


def _utf8(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _first_surrogate(s: str) -> str:
    for c in s:
        if 0xD800 <= ord(c) <= 0xDFFF:
            return f"\\u{ord(c):04x}"
    return "?"  # pragma: no cover - only called when encoding failed


# ---------------------------------------------------------------- fields, validated where they are read

def finite(v):
    """``v`` as a float when it is a finite real number (not a bool), else None."""
    if type(v) is float:            # the common case first: a trace reads millions of these
        return v if math.isfinite(v) else None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def whole(v, lo: int | None = None, hi: int | None = None):
    """``v`` as an int when it is a whole number (an int, or an integral finite float) within [lo, hi], else None."""
    if isinstance(v, bool):
        return None
    if isinstance(v, float):
        if not math.isfinite(v) or not v.is_integer():
            return None
        v = int(v)
    if not isinstance(v, int):
        return None
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        return None
    return v


def text(v, default=None):
    """``v`` when it is a string, else ``default``."""
    return v if isinstance(v, str) else default


def key(v):
    """A JSON scalar usable as a join key (str or whole number), else None: a list or dict never joins."""
    if type(v) is int or isinstance(v, str):
        return v
    return whole(v)
