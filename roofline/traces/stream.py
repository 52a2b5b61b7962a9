"""Reading a large trace's events one at a time (``roofline.traces.events`` uses it past ``STREAM_BYTES``).

``json.loads`` of a 1 GB trace holds every event as a dict at once (several GB). ``stream_events``
reads the file in chunks (gzip decompressed as it goes) and decodes one event at a time with the
C decoder (``json.JSONDecoder.raw_decode``): the caller keeps what it needs of each event and the
rest is freed. The top-level fields other than ``traceEvents`` (``deviceProperties``,
``distributedInfo``, ``record_shapes``, ...) are decoded whole into ``head``, wherever they sit.
Malformed input is a ``safejson.BadJSON`` naming the byte offset, as ``safejson.loads`` does.
"""

from __future__ import annotations

import codecs
import gzip
import json

from ..safejson import BadJSON

CHUNK = 4 << 20
_WS = " \t\n\r"
_DEC = json.JSONDecoder()


class _Reader:
    def __init__(self, f):
        self.f, self.buf, self.pos, self.eof, self.base = f, "", 0, False, 0
        self.utf8 = codecs.getincrementaldecoder("utf-8")()

    def more(self) -> bool:
        if self.eof:
            return False
        try:
            raw = self.f.read(CHUNK)
        except UnicodeDecodeError:
            raise BadJSON("the trace is not UTF-8 text.") from None
        try:
            text = self.utf8.decode(raw, final=not raw)
        except UnicodeDecodeError:
            raise BadJSON("the trace is not UTF-8 text.") from None
        if not raw:
            self.eof = True
        if self.pos > CHUNK:
            self.base += self.pos
            self.buf, self.pos = self.buf[self.pos:], 0
        self.buf += text
        return bool(raw) or bool(text)

    def peek(self) -> str:
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in _WS:
                self.pos += 1
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self.more():
                raise BadJSON("the trace is not valid JSON (it ends early, so it was probably cut off while being "
                              "written).")

    def expect(self, chars: str) -> str:
        c = self.peek()
        if c not in chars:
            raise BadJSON(f"the trace is not valid JSON (offset {self.base + self.pos:,}: expected "
                          f"{' or '.join(repr(x) for x in chars)}, found {c!r}).")
        self.pos += 1
        return c

    def value(self):
        self.peek()
        while True:
            try:
                v, end = _DEC.raw_decode(self.buf, self.pos)
            except RecursionError:
                raise BadJSON("the trace is nested deeper than any JSON reader allows levels (a JSON document of at "
                              "most a few hundred is read).") from None
            except json.JSONDecodeError as e:
                if self.more():
                    continue
                cut = e.pos >= len(self.buf.rstrip()) - 1 or e.msg.startswith("Unterminated")
                raise BadJSON(f"the trace is not valid JSON (offset {self.base + e.pos:,}: {e.msg})"
                              + ("; it ends early, so it was probably cut off while being written." if cut
                                 else ".")) from None
            if end == len(self.buf) and not self.eof and self.more():
                continue       # a number may go on in the next chunk
            self.pos = end
            return v


def _open(path):
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rb") if gz else open(path, "rb")


def stream_events(path, head: dict):
    """Yield the trace's events in file order; fill ``head`` with its other top-level fields (and
    ``head["traceEvents"] = True`` when it had the list). A top-level list is the events themselves."""
    try:
        with _open(path) as f:
            r = _Reader(f)
            c = r.expect("{[")
            if c == "[":
                head["traceEvents"] = True
                yield from _array(r, opened=True)
                return
            if r.peek() == "}":
                r.pos += 1
                return
            while True:
                k = r.value()
                if not isinstance(k, str):
                    raise BadJSON("the trace is not valid JSON (an object key that is not a string).")
                r.expect(":")
                if k == "traceEvents" and r.peek() == "[":
                    r.pos += 1
                    head["traceEvents"] = True
                    yield from _array(r, opened=True)
                else:
                    head[k] = r.value()
                if r.expect(",}") == "}":
                    return
    except (EOFError, gzip.BadGzipFile, OSError) as e:
        raise BadJSON(f"the trace is a gzip file that is cut off or corrupt (decompression failed: {e}).") from None


def _array(r: _Reader, opened: bool):
    if r.peek() == "]":
        r.pos += 1
        return
    while True:
        yield r.value()
        if r.expect(",]") == "]":
            return
