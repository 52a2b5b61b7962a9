"""The OpenAI-compatible client: a served model measured from outside, as its users' clients see it.

``stream_request`` sends one streaming request (``/v1/completions`` or ``/v1/chat/completions``
with ``stream: true`` and ``stream_options: {"include_usage": true}``) through an
``httpx.AsyncClient`` and turns the server-sent events (``data: {json}`` lines, a blank line
between events, ``data: [DONE]`` last) into a ``roofline.latency.RequestTimeline``. Every
timestamp is ``profiler.timing.now()`` minus the run's start, so the times read like an
in-process run's. The definitions are vLLM ``bench serve``'s (``roofline.latency.ENDPOINT_FORMULAS``):

* ``sent``: just before the request is handed to httpx (as vLLM's client takes it before
  ``session.post``), after the wait for a concurrency slot (that wait is the timeline's
  ``queue``: scheduled arrival -> sent);
* an *output chunk* is an event whose ``choices[0]`` carries ``text`` (completions) or
  ``delta.content`` (chat). Not output: a chat role announcement with empty content, an empty
  chunk that only carries ``finish_reason``, the usage chunk (``choices: []``);
* tokens per chunk: the increase of ``usage.completion_tokens`` when each chunk carries usage
  (vLLM and SGLang do when asked with ``continuous_usage_stats``), else one per output chunk,
  checked against the final usage: extra tokens are spread evenly over the chunks after the
  first (``RequestTimeline.token_counts`` says which rule applied). A usage count beyond the
  ``max_tokens`` asked for cannot be true: it is recorded (``served_output_tokens``) but not
  believed, the tokens are counted one per chunk, and the rule says "usage beyond the request";
  so no count is ever larger than the request (a server claiming 10**9 tokens costs nothing);
* a chunk of k tokens splits the gap since the previous chunk evenly into k deliveries; the
  tokens of the first chunk arrive with it (TTFT is the first chunk's time);
* ``finish`` is the last output chunk, so E2E = finish - sent and TPOT = (E2E - TTFT) / (n - 1).

A request fails, with its reason kept in ``error`` as "kind: detail" (``failure_kind``): ``http
NNN`` (an error status), ``not an event stream`` (a 200 that does not stream), ``error event``
(the server reported an error mid-stream), ``malformed event`` (not JSON), ``disconnected`` (the
stream ended without ``[DONE]`` or a finish reason, or the connection broke), ``timeout`` (no
complete answer within the per-request timeout), ``connection`` (no connection).

``discover`` (``GET /v1/models``) and ``prompt_token_count`` (``POST /tokenize``, vLLM's and
llama.cpp's forms) run before anything is measured; their failures are one-line
``RooflineError``s. Every event and JSON answer is read through ``roofline.safejson`` (an event:
1 MB, 32 levels deep): an event nested 100,000 deep fails its request as a malformed event.
The API key is sent as ``Authorization: Bearer ...`` and never stored: ``scrub`` takes it (and
any ``Bearer``/``Authorization`` value) out of every text a server sent back before it is
kept or printed, so a 401 body that echoes the key records ``[redacted]``.
"""

from __future__ import annotations

import asyncio
import re
import signal
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from roofline.dtypes import normalize_dtype
from roofline.errors import RooflineError
from roofline.latency import RequestTimeline
from roofline.safejson import HTTP_REPLY, SSE_EVENT, BadJSON, loads, whole

from .timing import now

APIS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
REDACTED = "[redacted]"
_CREDENTIAL = re.compile(r"(?i)(bearer\s+|authorization[\"']?\s*[:=]\s*[\"']?(?:(?:bearer|basic|token)\s+)?|api[_-]?key[\"']?\s*[:=]\s*[\"']?)"
                         r"(?!\[redacted\])[^\s\"',;}]+")


def scrub(text: str, secret: str | None = None) -> str:
    """``text`` with ``secret`` and every Bearer / Authorization / api_key value replaced by ``[redacted]``."""
    text = str(text)
    if secret:
        text = text.replace(secret, REDACTED)
    return _CREDENTIAL.sub(lambda m: m.group(1) + REDACTED, text)


_SECRET_PARAM = re.compile(r"(?i)^(api[_-]?key|key|token|access[_-]?token|auth|password|secret|sig|signature)$")


def public_url(url: str) -> str:
    """``url`` as it may be printed or recorded: a password in ``user:password@host`` and the value of every
    credential-looking query parameter (api_key, key, token, ...) become ``[redacted]``.

    >>> public_url("https://me:s3cret@host:8000/v1?api_key=abc&x=1")
    'https://me:[redacted]@host:8000/v1?api_key=[redacted]&x=1'
    """
    try:
        p = urlsplit(str(url))
        host = p.netloc
    except ValueError:
        return scrub(url)
    if "@" in host:
        user, _, rest = host.rpartition("@")
        name = user.split(":", 1)[0]
        host = f"{name}:{REDACTED}@{rest}" if ":" in user else f"{REDACTED}@{rest}"
    query = p.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode([(k, REDACTED if _SECRET_PARAM.match(k) else v) for k, v in pairs], safe="[]")
    return urlunsplit((p.scheme, host, p.path, query, p.fragment))


def base_url(url: str) -> str:
    """'http://host:8000/v1/' -> 'http://host:8000'; RooflineError unless an http(s) URL with a host."""
    u = str(url or "").strip()
    parts = urlsplit(u)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise RooflineError(f"--endpoint {public_url(u)!r} is not an http(s) URL: give the server's base URL, e.g. "
                            "http://127.0.0.1:8000 (or .../v1).")
    try:
        parts.port
    except ValueError:
        raise RooflineError(f"--endpoint {public_url(u)!r} has a bad port: give e.g. http://127.0.0.1:8000.") from None
    u = u.rstrip("/")
    return u[:-3] if u.endswith("/v1") else u


@dataclass(frozen=True)
class Target:
    """Where and how requests go. ``api_key`` is sent, never recorded (it is left out of ``repr``)."""

    base: str                       # base URL, no /v1
    api: str = "completions"        # "completions" | "chat"
    model: str = ""
    timeout: float = 600.0          # seconds per request, first byte to [DONE]
    connect_timeout: float = 10.0
    ignore_eos: bool = True         # also sends min_tokens = max_tokens (vLLM, SGLang, llama.cpp accept them)
    usage_per_chunk: bool = True    # stream_options.continuous_usage_stats (vLLM, SGLang)
    api_key: str | None = field(default=None, repr=False)

    def body(self, prompt: str, max_tokens: int) -> dict:
        b = {"model": self.model, "max_tokens": int(max_tokens), "stream": True, "temperature": 0.0,
             "stream_options": {"include_usage": True}}
        if self.usage_per_chunk:
            b["stream_options"]["continuous_usage_stats"] = True
        if self.ignore_eos:
            b.update(ignore_eos=True, min_tokens=int(max_tokens))
        if self.api == "chat":
            b["messages"] = [{"role": "user", "content": prompt}]
        else:
            b["prompt"] = prompt
        return b

    def client(self, max_connections: int | None = None, timeout: float | None = None):
        """An ``httpx.AsyncClient`` for this target: connect timeout, per-read timeout (``timeout``, default the
        request timeout), the key as a header."""
        import httpx

        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        return httpx.AsyncClient(base_url=self.base, headers=headers, trust_env=False,
                                 timeout=httpx.Timeout(timeout or self.timeout, connect=self.connect_timeout),
                                 limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=None))


# ---------------------------------------------------------------- before the run: what is served

async def discover(client, base: str, model: str = "") -> tuple[str, list]:
    """(model to use, ids served) from ``GET /v1/models``: the first id when ``model`` is empty."""
    import httpx

    base = public_url(base)          # only for the messages: the client holds the real one

    try:
        r = await client.get("/v1/models")
    except httpx.ConnectTimeout:
        raise RooflineError(f"cannot reach {base}: no connection within the connect timeout "
                            f"({client.timeout.connect:g} s). Is the host right and the server up?") from None
    except httpx.ConnectError as e:
        raise RooflineError(f"cannot reach {base}: {_reason(e)}. Is the server running there?") from None
    except httpx.TimeoutException:
        raise RooflineError(f"{base} accepted the connection but did not answer GET /v1/models within "
                            f"{client.timeout.read:g} s.") from None
    except httpx.HTTPError as e:
        raise RooflineError(f"GET {base}/v1/models failed: {_reason(e)}.") from None
    if r.status_code in (401, 403):
        raise RooflineError(f"{base} refused the request (HTTP {r.status_code}): give the API key with --api-key "
                            "or OPENAI_API_KEY.")
    ids = None
    if r.status_code == 200:
        try:
            doc = loads(r.content, limits=HTTP_REPLY)
            ids = [str(m["id"]) for m in doc["data"]]
        except (BadJSON, KeyError, TypeError, IndexError):
            ids = None
    if ids is None:
        what = r.headers.get("content-type", "no content type").split(";")[0]
        raise RooflineError(f"{base} does not look like an OpenAI-compatible server: GET /v1/models answered HTTP "
                            f"{r.status_code} ({what}), not a model list. Give the server's base URL.")
    if not ids:
        raise RooflineError(f"{base} serves no model (GET /v1/models lists none).")
    if model and model not in ids:
        raise RooflineError(f"model {model!r} is not served at {base}; it serves: {', '.join(ids[:10])}"
                            f"{' ...' if len(ids) > 10 else ''}. Give one of them with --model-name.")
    return (model or ids[0]), ids


async def served_dtype(client, model: str) -> str | None:
    """The compute dtype the server lists for ``model`` (``GET /v1/models``: ``roofline serve`` adds ``dtype``); None
    when it says none (most servers) or anything is wrong."""
    import httpx

    try:
        doc = loads((await client.get("/v1/models")).content, limits=HTTP_REPLY)
        entry = next(m for m in doc["data"] if isinstance(m, dict) and m.get("id") == model)
        return normalize_dtype(entry["dtype"]) if isinstance(entry.get("dtype"), str) else None
    except (httpx.HTTPError, BadJSON, KeyError, TypeError, StopIteration, ValueError):
        return None


async def prompt_token_count(client, model: str, text: str, chat: bool = False) -> int | None:
    """Tokens the server counts for ``text`` (its ``/tokenize``: vLLM's or llama.cpp's form); None if not offered.

    ``chat``: as the one user message of a chat request, its template included (vLLM's ``messages`` form)."""
    import httpx

    first = {"model": model, "messages": [{"role": "user", "content": text}]} if chat else \
        {"model": model, "prompt": text}
    for body in (first, {"content": text}):
        try:
            r = await client.post("/tokenize", json=body)
        except httpx.HTTPError:
            return None
        if r.status_code == 404:
            return None
        if r.status_code != 200:
            continue
        try:
            doc = loads(r.content, limits=HTTP_REPLY)
        except BadJSON:
            return None
        if isinstance(doc, dict) and isinstance(doc.get("count"), int) and not isinstance(doc["count"], bool):
            return doc["count"]
        toks = doc.get("tokens") if isinstance(doc, dict) else doc
        if isinstance(toks, list):
            return len(toks)
        return None
    return None


async def chars_per_token(client, model: str, sample: str) -> float | None:
    """Characters per token of the server's tokenizer on ``sample`` (its special tokens aside); None without /tokenize."""
    got = await prompt_token_count(client, model, sample)
    if got is None:
        return None
    return len(sample) / max(got - 1, 1)


async def sized_prompt(client, model: str, tokens: int, make, per: float | None, tries: int = 4,
                       chat: bool = False) -> tuple:
    """(text, the server's count) for a prompt of about ``tokens`` tokens of the *server's* tokenizer.

    ``make(chars)`` builds a text of ``chars`` characters; ``per``: characters per token
    (``chars_per_token``). Without a ``/tokenize`` (``per`` None) the text is ``tokens - 1``
    characters, one token each in our byte tokenizer, and the count is None (usage tells later).
    ``chat``: sized as a chat request's prompt, template included.
    """
    if per is None:
        return make(max(tokens - 1, 0)), None
    chars = max(round((tokens - 1) * per), 0)
    text = make(chars)
    got = await prompt_token_count(client, model, text, chat)
    if got is None:
        return text, None
    best = (abs(got - tokens), text, got)
    for _ in range(tries):
        if got == tokens:
            break
        step = round((tokens - got) * per) or (1 if tokens > got else -1)
        chars = max(0, chars + step)
        text = make(chars)
        got = await prompt_token_count(client, model, text, chat)
        if got is None:
            break
        best = min(best, (abs(got - tokens), text, got), key=lambda b: b[0])
    return best[1], best[2]


# ---------------------------------------------------------------- one request

class Failed(Exception):
    """A request failed; ``args[0]`` is "kind: detail"."""


class SSE:
    """Server-sent events, line by line: ``feed(line)`` returns an event's data when a blank line ends it."""

    def __init__(self):
        self.data: list = []

    def feed(self, line: str):
        if line == "":
            return self.flush()
        if line.startswith(":"):                   # a comment (keep-alive ping)
            return None
        name, _, value = line.partition(":")
        if name == "data":
            self.data.append(value[1:] if value.startswith(" ") else value)
        return None                                # event:, id:, retry: carry nothing we use

    def flush(self):
        if not self.data:
            return None
        out, self.data = "\n".join(self.data), []
        return out


@dataclass
class _Stream:
    """What has arrived so far (kept when the request fails or times out)."""

    sent: float = float("nan")
    chunks: list = field(default_factory=list)     # (time, tokens or None = one by the text rule)
    usage: dict | None = None
    per_chunk: bool = False
    last_usage_tokens: int = 0
    done: bool = False
    finish_reason: str | None = None

    @property
    def received(self) -> int:
        return sum(k or 1 for _, k in self.chunks)


def _error_text(r_text: str, secret: str | None = None) -> str:
    """An error body's message (OpenAI's form) or its text, credentials scrubbed before it is cut to 200."""
    try:
        doc = loads(r_text, limits=HTTP_REPLY)
        err = doc.get("error", doc) if isinstance(doc, dict) else doc
        msg = err.get("message") if isinstance(err, dict) else None
        if msg:
            return scrub(str(msg), secret)[:200]
    except BadJSON:
        pass
    return scrub(" ".join(r_text.split()), secret)[:200] or "no body"


def _reason(e) -> str:
    return str(e) or type(e).__name__


def _event(st: _Stream, data: str, t: float, api: str, secret: str | None = None) -> None:
    if data.strip() == "[DONE]":
        st.done = True
        return
    try:
        d = loads(data, limits=SSE_EVENT)
    except BadJSON as e:
        raise Failed(f"malformed event: not JSON ({str(e).rstrip('.')}): {scrub(data[:200], secret)[:80]!r}") from None
    if not isinstance(d, dict):
        raise Failed(f"malformed event: not a JSON object: {scrub(data[:200], secret)[:80]!r}")
    if "error" in d or d.get("object") == "error":
        err = d.get("error", d)
        msg = err.get("message", err) if isinstance(err, dict) else err
        raise Failed(f"error event: {scrub(str(msg), secret)[:200]}")
    usage = d.get("usage") if isinstance(d.get("usage"), dict) else None
    if usage is not None:
        st.usage = usage
    choices = d.get("choices") or []
    if not isinstance(choices, list) or (choices and not isinstance(choices[0], dict)):
        raise Failed(f"malformed event: 'choices' is not a list of objects: {data[:80]!r}")
    if not choices:
        return
    c = choices[0]
    if c.get("finish_reason"):
        st.finish_reason = str(c["finish_reason"])
    ct = whole(usage.get("completion_tokens"), 0) if usage else None
    if ct is not None:
        st.per_chunk = True
        k, st.last_usage_tokens = ct - st.last_usage_tokens, max(ct, st.last_usage_tokens)
        if k > 0:
            st.chunks.append((t, k))
        return
    if api == "chat":
        delta = c.get("delta") if isinstance(c.get("delta"), dict) else {}
        text = delta.get("content")
        announce = "role" in delta
    else:
        text, announce = c.get("text"), False
    if isinstance(text, str) and (text or not (c.get("finish_reason") or announce)):
        st.chunks.append((t, None))


async def _stream(client, target: Target, prompt: str, max_tokens: int, st: _Stream, t0: float) -> None:
    import httpx

    body = target.body(prompt, max_tokens)
    try:
        st.sent = now() - t0                       # the request is handed to httpx now
        async with client.stream("POST", APIS[target.api], json=body) as r:
            if r.status_code != 200:
                text = (await r.aread())[:HTTP_REPLY.max_bytes].decode("utf-8", "replace")
                raise Failed(f"http {r.status_code}: {_error_text(text, target.api_key)}")
            ctype = r.headers.get("content-type", "").split(";")[0].strip()
            if ctype != "text/event-stream":
                raise Failed(f"not an event stream: HTTP 200 with content type {ctype or 'none'!r}, not "
                             "text/event-stream")
            sse = SSE()
            async for line in r.aiter_lines():
                t = now() - t0
                data = sse.feed(line)
                if data is not None and not st.done:    # read on to the end: the connection is reused
                    _event(st, data, t, target.api, target.api_key)
            data = sse.flush()
            if data is not None and not st.done:
                _event(st, data, now() - t0, target.api, target.api_key)
    except httpx.ConnectTimeout:
        raise Failed(f"connection: no connection within {target.connect_timeout:g} s") from None
    except httpx.ConnectError as e:
        raise Failed(f"connection: {_reason(e)}") from None
    except httpx.TimeoutException:
        raise Failed(f"timeout: nothing received for {target.timeout:g} s ({st.received} tokens received)") from None
    except (httpx.RemoteProtocolError, httpx.ReadError) as e:
        raise Failed(f"disconnected: after {st.received} tokens ({_reason(e)})") from None
    except httpx.HTTPError as e:
        raise Failed(f"disconnected: after {st.received} tokens ({type(e).__name__}: {_reason(e)})") from None
    if not st.done and st.finish_reason is None:
        raise Failed(f"disconnected: the stream ended after {st.received} tokens without [DONE]")
    if not st.chunks:
        raise Failed("no output: the stream carried no output chunk")


def split_tokens(chunks, total: int | None, per_chunk: bool, limit: int | None = None) -> tuple[list, str]:
    """(tokens per output chunk, the ``TOKEN_COUNTS`` rule that applied); see the module docstring.

    ``limit``: the ``max_tokens`` asked for; usage that claims more is not believed (one token per chunk)."""
    ones = [1] * len(chunks)
    if limit is not None and len(chunks) > limit:
        return ones, "chunks beyond the request"
    if per_chunk and all(k is not None for _, k in chunks):
        counts = [k for _, k in chunks]
        if limit is None or sum(counts) <= limit:
            return counts, "usage per chunk"
        return ones, "usage beyond the request"
    if total is not None and limit is not None and total > limit:
        return ones, "usage beyond the request"
    counts = [k or 1 for _, k in chunks]
    if limit is not None and sum(counts) > limit:
        return ones, "usage beyond the request"
    if total is None:
        return counts, "one per chunk, no usage"
    have = sum(counts)
    if total == have:
        return counts, "one per chunk"
    if total < have:
        return counts, "chunks, usage disagrees"
    extra, later = total - have, len(counts) - 1
    if later == 0:
        counts[0] += extra
    else:                                          # evenly over the chunks after the first
        for i in range(1, len(counts)):
            counts[i] += (i * extra) // later - ((i - 1) * extra) // later
    return counts, "spread from usage"


def deliveries(times, counts) -> list:
    """A chunk of k tokens at t after the previous chunk at p: deliveries p + (t - p) j / k, j = 1..k;
    the first chunk's tokens all arrive at its time."""
    out = []
    for i, (t, k) in enumerate(zip(times, counts)):
        if i == 0:
            out += [t] * k
        else:
            p = times[i - 1]
            out += [p + (t - p) * j / k for j in range(1, k)] + [t]
    return out


async def stream_request(client, target: Target, rid: int, prompt: str, max_tokens: int, *, t0: float,
                         arrival: float, prompt_tokens: int, config: str = "") -> RequestTimeline:
    """Send one request now and return its timeline (ok or failed, never raising for the server's faults)."""
    st = _Stream(sent=now() - t0)
    status, error = "ok", ""
    try:
        await asyncio.wait_for(_stream(client, target, prompt, max_tokens, st, t0), target.timeout)
    except Failed as e:
        status, error = "failed", str(e)
    except asyncio.TimeoutError:
        status, error = "failed", f"timeout: no complete answer within {target.timeout:g} s ({st.received} tokens " \
                                  "received)"
    end = now() - t0
    usage = st.usage or {}
    total = whole(usage.get("completion_tokens"), 0)
    if status == "ok":
        counts, rule = split_tokens(st.chunks, total, st.per_chunk, max_tokens)
    else:                                          # what arrived before the failure, no more than was asked for
        counts = [k or 1 for _, k in st.chunks]
        if sum(counts) > max_tokens:
            counts = [1] * min(len(counts), max_tokens)
        rule = ""
    times = [t for t, _ in st.chunks][:len(counts)]
    dl = deliveries(times, counts)
    served_prompt = whole(usage.get("prompt_tokens"), 0)
    details = usage.get("prompt_tokens_details") if isinstance(usage.get("prompt_tokens_details"), dict) else {}
    cached = whole(details.get("cached_tokens"), 0) or 0
    sent = st.sent
    return RequestTimeline(
        id=rid, arrival=arrival, queue=(arrival, sent), deliveries=tuple(dl),
        finish=(times[-1] if status == "ok" else end), prompt_tokens=prompt_tokens, cached_tokens=max(0, cached),
        output_tokens=max_tokens, status=status, error=error, config=config, sent=sent,
        chunk_tokens=tuple(counts), served_prompt_tokens=served_prompt, served_output_tokens=total,
        token_counts=rule)


async def run_requests(target: Target, prompts, arrivals, *, concurrency: int | None, config: str = "",
                       on_finish=None) -> list:
    """Send ``prompts`` [(text, requested prompt tokens, max_tokens)] at ``arrivals`` (seconds after the start),
    at most ``concurrency`` at once (None: no limit); ``on_finish(timeline)`` as each one ends."""
    out = []
    sem = asyncio.Semaphore(concurrency) if concurrency else None
    async with target.client(max_connections=concurrency) as client:
        try:                                 # open one connection before the clock starts, as a client would be
            await client.get("/v1/models")
        except Exception:  # noqa: BLE001 - the requests will say what is wrong, each with its reason
            pass
        t0 = now()

        async def one(i: int):
            text, n_prompt, max_tokens = prompts[i]
            delay = t0 + arrivals[i] - now()
            if delay > 0:
                await asyncio.sleep(delay)
            if sem is None:
                t = await stream_request(client, target, i, text, max_tokens, t0=t0, arrival=arrivals[i],
                                         prompt_tokens=n_prompt, config=config)
            else:
                async with sem:
                    t = await stream_request(client, target, i, text, max_tokens, t0=t0, arrival=arrivals[i],
                                             prompt_tokens=n_prompt, config=config)
            out.append(t)
            if on_finish is not None:
                on_finish(t)

        tasks = [asyncio.ensure_future(one(i)) for i in range(len(prompts))]
        with _interruptible(tasks) as interrupted:
            await asyncio.gather(*tasks, return_exceptions=True)
        if interrupted:                  # Ctrl-C: what finished is kept (on_finish wrote it); the caller resumes
            raise KeyboardInterrupt
        for t in tasks:                  # a request's own error is a failed timeline; anything else is a bug: raise
            if t.exception() is not None:
                raise t.exception()
    out.sort(key=lambda t: t.id)
    return out


class _interruptible:
    """SIGINT cancels ``tasks`` (every request in flight or waiting) and is remembered, so the run stops even
    where a cancellation is swallowed on its way (asyncio.wait_for in Python 3.11 can lose one that races the
    inner task's end). Outside the main thread, or where the loop cannot take signal handlers, a no-op."""

    def __init__(self, tasks):
        self.tasks, self.flag, self.installed = tasks, [], False

    def __enter__(self):
        try:
            asyncio.get_running_loop().add_signal_handler(signal.SIGINT, self._on_sigint)
            self.installed = True
        except (RuntimeError, ValueError, NotImplementedError):
            pass
        return self.flag

    def _on_sigint(self):
        self.flag.append(True)
        for t in self.tasks:
            t.cancel()

    def __exit__(self, *exc):
        if self.installed:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGINT)
        return False

