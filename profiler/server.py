"""``roofline serve``: our model and continuous-batching loop behind an OpenAI-compatible HTTP API.

Starlette on uvicorn (as vLLM uses): ``POST /v1/completions`` and ``/v1/chat/completions``
(streaming as server-sent events and not), ``GET /v1/models``, ``GET /health``, ``POST /tokenize``
(vLLM's form: ``{"prompt"}`` or ``{"messages"}`` -> ``{"count", "max_model_len", "tokens"}``), ``GET /metrics``
(requests running, waiting, in flight, finished, cancelled; free KV slots; Prometheus text; with speculation vLLM's
four ``spec_decode`` counters under the ``roofline:`` prefix, ``profiler.spec_metrics``).
Any OpenAI client can measure it, so the chunk budget and the prefix cache show from outside.

Design: one **engine thread** owns the model and ``profiler.serving.Engine`` (the scheduler's
executor: chunk budget, prefix cache, slots) and steps it while requests are live; the event
loop only parses, validates and writes bytes, so a slow model step never blocks I/O. Requests
reach the thread through a queue (``EngineThread.submit`` / ``cancel``); each token comes back
through ``loop.call_soon_threadsafe`` into the request's own ``asyncio.Queue``.

* Requests are validated first: a bad one is answered 400 with an OpenAI-style error
  (``{"error": {"message", "type": "invalid_request_error", "param", "code"}}``); an unknown
  model 404; a prompt plus ``max_tokens`` past ``--max-model-len`` 400.
* At most ``max_slots + max_queue`` requests are in flight; one more is answered 503.
* Generation is greedy (``temperature`` and the other sampling fields are accepted and
  ignored); the byte tokenizer's end-of-sequence id stops a request unless ``ignore_eos``
  (after ``min_tokens``). A stream sends one chunk per generated token (its text may be empty:
  a byte that completes no UTF-8 character yet), then a chunk with ``finish_reason``, the usage
  chunk when ``stream_options.include_usage``, and ``data: [DONE]``. With
  ``continuous_usage_stats`` every chunk carries the usage so far (vLLM's option).
* A client that goes away (its connection closes) cancels its request: the engine frees its
  KV slot at the next step.
* Bodies are read through ``roofline.safejson`` (``HTTP_BODY``: 8 MB, 32 levels deep, UTF-8 text
  only): a body nested 100,000 deep or holding a lone surrogate is a 400, never a 500. A client
  that sends half a body and leaves gets nothing and leaves nothing in the log.
* SIGINT / SIGTERM: the server stops accepting, new requests on open connections are answered
  503, running requests get ``drain_s`` (``--shutdown-grace``) to finish; the rest are cancelled
  and end with a proper final event (a stream: an error event of type ``server_shutdown`` and
  ``data: [DONE]``; a whole response: HTTP 503). Then the engine thread stops. No task is left
  for uvicorn to cancel, so no traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import queue
import threading
import time

from roofline.safejson import HTTP_BODY, BadJSON, loads

from .serving import Engine, RequestSpec
from .tokenizer import ByteTokenizer

GRACE_S = 3.0          # default seconds running requests get to finish after SIGTERM / SIGINT
SHUTDOWN_MESSAGE = "the server is shutting down: the request was stopped before it finished; retry elsewhere"


class EngineThread:
    """The model's thread: it drains the inbox between steps and steps the engine while requests are live."""

    def __init__(self, model, *, chunk_budget=None, prefix_cache=None, block_size=16, draft=None, spec_k=0):
        self.model, self.kw = model, dict(chunk_budget=chunk_budget, prefix_cache=prefix_cache, block_size=block_size,
                                          draft=draft, spec_k=spec_k)
        self.spec_k = spec_k
        self.spec = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_position": [0] * spec_k}
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.sinks: dict = {}
        self.error = ""
        self.counts = {"running": 0, "waiting": 0, "slots_free": len(model.lengths), "finished": 0, "cancelled": 0}
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="roofline-engine", daemon=True)

    def start(self):
        self.thread.start()

    def stop(self, timeout: float = 10.0):
        self._stop.set()
        self.inbox.put(("stop",))
        self.thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self.thread.is_alive() and not self.error

    def submit(self, rid: int, prompt: str, max_tokens: int, sink, *, stop_ids=(), min_tokens: int = 0):
        """Queue a request; ``sink(event)`` gets ("token", text) per token and ("done", timeline), on the engine thread."""
        self.inbox.put(("add", rid, prompt, max_tokens, tuple(stop_ids), min_tokens, sink))

    def cancel(self, rid: int):
        self.inbox.put(("cancel", rid))

    def _run(self):
        eng = Engine(self.model, on_token=self._token, on_finish=self._finished, **self.kw)
        try:
            while not self._stop.is_set():
                self._drain(eng, block=not eng.busy)
                if eng.busy:
                    eng.step()
                self._count(eng)
        except Exception as e:  # noqa: BLE001 - a bug in the loop: every waiting client hears it, /health fails
            self.error = f"{type(e).__name__}: {e}"
            for sink in list(self.sinks.values()):
                sink(("error", self.error))
            self.sinks.clear()

    def _drain(self, eng, block: bool):
        try:
            msg = self.inbox.get(timeout=0.1) if block else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            if msg[0] == "add":
                _, rid, prompt, max_tokens, stop_ids, min_tokens, sink = msg
                self.sinks[rid] = sink
                eng.arrive(RequestSpec(rid, eng.now(), prompt, max_tokens, stop_ids, min_tokens))
            elif msg[0] == "cancel":
                eng.cancel(msg[1], "cancelled: the client went away")
            try:
                msg = self.inbox.get_nowait()
            except queue.Empty:
                return

    def _count(self, eng):
        sch, c = eng.sched, self.counts
        for _, t in eng.done:
            c["finished"] += 1
            c["cancelled"] += t.error.startswith("cancelled")
        sp = self.spec
        for st in eng.steps:                # vLLM's counting: a draft per round with drafts, accepted per position
            for _, drafted, accepted, _ in st.get("rounds", ()):
                if drafted:
                    sp["drafts"] += 1
                    sp["draft_tokens"] += drafted
                    sp["accepted"] += accepted
                    for j in range(accepted):
                        sp["per_position"][j] += 1
        eng.done.clear()                    # a long-running server keeps no history it does not report
        eng.steps.clear()
        self.counts = {**c, "running": len(sch.running), "waiting": len(sch.waiting),
                       "slots_free": len(sch.free) + len(sch.parked)}   # one dict, swapped whole

    def _token(self, rid, model_id, piece):
        sink = self.sinks.get(rid)
        if sink is not None:
            sink(("token", piece))

    def _finished(self, t):
        sink = self.sinks.pop(t.id, None)
        if sink is not None:
            sink(("done", t))


# ---------------------------------------------------------------- requests

class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None, status: int = 400, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.message, self.param, self.status, self.kind = message, param, status, kind


def error_body(message: str, kind: str = "invalid_request_error", param=None, code=None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def chat_prompt(messages) -> str:
    """The chat template: one "role: content" line per message, then "assistant:"."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list of {role, content} objects.", "messages")
    lines = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadRequest("each message must be an object with a string 'role'.", "messages")
        c = m.get("content", "")
        if isinstance(c, list):             # [{"type": "text", "text": ...}, ...]
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in c):
                raise BadRequest("message content parts must be {type: 'text', text: ...}: only text is served.",
                                 "messages")
            c = "".join(p["text"] for p in c)
        elif c is None:
            c = ""
        elif not isinstance(c, str):
            raise BadRequest("message 'content' must be a string or a list of text parts.", "messages")
        lines.append(f"{m['role']}: {c}")
    return "\n".join(lines) + "\nassistant:"


def _int(body: dict, key: str, default, lo: int, hi: int | None = None):
    v = body.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
        rng = f"from {lo} to {hi}" if hi is not None else f"at least {lo}"
        raise BadRequest(f"'{key}' must be a whole number {rng}, not {v!r}.", key)
    return v


def _bool(body: dict, key: str, default: bool = False) -> bool:
    v = body.get(key, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise BadRequest(f"'{key}' must be true or false, not {v!r}.", key)
    return v


def parse_request(body, *, chat: bool, served: str, max_len: int) -> dict:
    """The fields we serve from a completions / chat body; BadRequest for anything wrong."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object.")
    model = body.get("model")
    if model is not None and model != served:
        raise BadRequest(f"The model `{model}` does not exist; this server serves {served!r}.", "model", 404,
                         "model_not_found")
    if chat:
        prompt = chat_prompt(body.get("messages"))
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise BadRequest("'prompt' must be a string (one prompt per request).", "prompt")
    n_prompt = len(ByteTokenizer().encode(prompt))
    room = max_len - n_prompt
    if room < 1:
        raise BadRequest(f"This model's maximum context length is {max_len} tokens; the prompt has {n_prompt}.",
                         "messages" if chat else "prompt")
    key = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _int(body, key, room if chat else 16, 1)
    if n_prompt + max_tokens > max_len:
        raise BadRequest(f"This model's maximum context length is {max_len} tokens. However, you requested "
                         f"{n_prompt + max_tokens} tokens ({n_prompt} in the prompt, {max_tokens} in the completion).",
                         key)
    if _int(body, "n", 1, 1) != 1:
        raise BadRequest("only n = 1 is served.", "n")
    stream = _bool(body, "stream")
    opts = body.get("stream_options")
    if opts is not None:
        if not stream:
            raise BadRequest("'stream_options' is only allowed when 'stream' is true.", "stream_options")
        if not isinstance(opts, dict):
            raise BadRequest("'stream_options' must be an object.", "stream_options")
    opts = opts or {}
    min_tokens = _int(body, "min_tokens", 0, 0, max_tokens)
    return {"prompt": prompt, "prompt_tokens": n_prompt, "max_tokens": max_tokens, "stream": stream,
            "include_usage": _bool(opts, "include_usage"), "continuous": _bool(opts, "continuous_usage_stats"),
            "ignore_eos": _bool(body, "ignore_eos"), "min_tokens": min_tokens}


# ---------------------------------------------------------------- responses

class Generation:
    """One accepted request as an ASGI response: its events (from the engine thread) become SSE chunks or
    one JSON body. The connection closing cancels the request."""

    def __init__(self, app_state, rid: int, req: dict, chat: bool):
        self.s, self.rid, self.req, self.chat = app_state, rid, req, chat
        self.events: asyncio.Queue = asyncio.Queue()
        self.created = int(time.time())
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{rid}"
        self.finished = False

    def sink(self, loop):
        return lambda ev: loop.call_soon_threadsafe(self.events.put_nowait, ev)

    def _usage(self, n: int, cached: int | None = None) -> dict:
        p = self.req["prompt_tokens"]
        u = {"prompt_tokens": p, "completion_tokens": n, "total_tokens": p + n}
        if cached is not None:
            u["prompt_tokens_details"] = {"cached_tokens": cached}
        return u

    def _chunk(self, choice: dict, usage=None) -> bytes:
        d = {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
             "created": self.created, "model": self.s.name, "choices": [choice]}
        if usage is not None:
            d["usage"] = usage
        return b"data: " + json.dumps(d).encode() + b"\n\n"

    def _piece(self, text: str, reason=None) -> dict:
        if self.chat:
            return {"index": 0, "delta": {"content": text} if reason is None else {}, "finish_reason": reason}
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}

    async def _next(self, listener):
        """The next engine event; None when the client went away; ("shutdown",) when the drain time is over."""
        get = asyncio.ensure_future(self.events.get())
        halt = asyncio.ensure_future(self.s.halt.wait())
        try:
            done, _ = await asyncio.wait({get, listener, halt}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            halt.cancel()
        if get in done:
            return get.result()
        get.cancel()
        if listener in done:
            return None                      # the client went away
        return ("shutdown",)

    async def __call__(self, scope, receive, send):
        async def disconnected():
            while (await receive())["type"] != "http.disconnect":
                pass

        listener = asyncio.ensure_future(disconnected())
        try:
            if self.req["stream"]:
                await self._stream(send, listener)
            else:
                await self._whole(send, listener)
        except OSError:                      # the socket broke while writing
            pass
        finally:
            listener.cancel()
            if not self.finished:
                self.s.engine.cancel(self.rid)
            self.s.inflight -= 1

    async def _stream(self, send, listener):
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]})
        n, cont = 0, self.req["continuous"]
        while True:
            ev = await self._next(listener)
            if ev is None:
                return
            if ev[0] == "token":
                if n == 0 and self.chat:
                    await send(_body(self._chunk({"index": 0, "delta": {"role": "assistant", "content": ""},
                                                  "finish_reason": None}, self._usage(0) if cont else None)))
                n += 1
                await send(_body(self._chunk(self._piece(ev[1]), self._usage(n) if cont else None)))
                continue

            if ev[0] == "shutdown":          # cancelled by the shutdown (the finally clause frees the slot)
                body = error_body(SHUTDOWN_MESSAGE, "server_shutdown", code=503)
                await send(_body(b"data: " + json.dumps(body).encode() + b"\n\ndata: [DONE]\n\n", more=False))
                return
            self.finished = True
            if ev[0] == "error" or not ev[1].ok:
                msg = ev[1] if ev[0] == "error" else ev[1].error
                out = b"data: " + json.dumps(error_body(msg, "server_error", code=500)).encode() + b"\n\n"
            else:
                t = ev[1]
                reason = "length" if t.n >= self.req["max_tokens"] else "stop"
                out = self._chunk(self._piece("", reason), self._usage(n, t.cached_tokens) if cont else None)
                if self.req["include_usage"]:
                    d = {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                         "created": self.created, "model": self.s.name, "choices": [],
                         "usage": self._usage(t.n, t.cached_tokens)}
                    out += b"data: " + json.dumps(d).encode() + b"\n\n"
            await send(_body(out + b"data: [DONE]\n\n", more=False))
            return

    async def _whole(self, send, listener):
        pieces = []
        while True:
            ev = await self._next(listener)
            if ev is None:
                return
            if ev[0] == "token":
                pieces.append(ev[1])
                continue
            if ev[0] == "shutdown":
                await _json(send, 503, error_body(SHUTDOWN_MESSAGE, "server_shutdown", code=503))
                return
            self.finished = True
            if ev[0] == "error" or not ev[1].ok:
                msg = ev[1] if ev[0] == "error" else ev[1].error
                await _json(send, 500, error_body(msg, "server_error", code=500))
                return
            t, text = ev[1], "".join(pieces)
            reason = "length" if t.n >= self.req["max_tokens"] else "stop"
            choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": reason}
                      if self.chat else {"index": 0, "text": text, "logprobs": None, "finish_reason": reason})
            await _json(send, 200, {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                                    "created": self.created, "model": self.s.name, "choices": [choice],
                                    "usage": self._usage(t.n, t.cached_tokens)})
            return


def _body(data: bytes, more: bool = True) -> dict:
    return {"type": "http.response.body", "body": data, "more_body": more}


async def _json(send, status: int, doc: dict):
    data = json.dumps(doc).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send(_body(data, more=False))


# ---------------------------------------------------------------- the app

class State:
    def __init__(self, engine: EngineThread, name: str, max_len: int, capacity: int, drain_s: float = GRACE_S):
        self.engine, self.name, self.max_len, self.capacity = engine, name, max_len, capacity
        self.drain_s = drain_s
        self.inflight = 0
        self.ids = itertools.count()
        self.stopping = False                # no new requests
        self._halt: asyncio.Event | None = None

    @property
    def halt(self) -> asyncio.Event:
        """Set when the drain time after a stop is over: running requests end with the shutdown event."""
        if self._halt is None:               # made on the event loop that uses it
            self._halt = asyncio.Event()
        return self._halt

    def begin_shutdown(self) -> None:
        """On the event loop: refuse new requests now, end the running ones ``drain_s`` from now."""
        if self.stopping:
            return
        self.stopping = True
        halt = self.halt
        if self.inflight == 0 or self.drain_s <= 0:
            halt.set()
        else:
            asyncio.get_running_loop().call_later(self.drain_s, halt.set)


async def read_json(request):
    """The request body as JSON through the one HTTP-body reader; BadRequest for anything wrong, None when the
    client left before sending all of it."""
    from starlette.requests import ClientDisconnect

    try:
        raw = await request.body()
    except ClientDisconnect:
        return None
    try:
        return loads(raw, limits=HTTP_BODY)
    except BadJSON as e:
        raise BadRequest(str(e)) from None


def make_app(engine: EngineThread, *, name: str, max_len: int, capacity: int, drain_s: float = GRACE_S,
             dtype: str = ""):
    """The Starlette app around a (not yet started) ``EngineThread``; the app's lifespan starts and stops it.

    ``capacity``: requests in flight (running + waiting) beyond which a new one is answered 503.
    ``drain_s``: seconds running requests get to finish once ``app.state.roofline.begin_shutdown()`` was called.
    ``dtype``: the served compute dtype, listed with the model (``GET /v1/models``) so a client's floor uses it.
    """
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    st = State(engine, name, max_len, capacity, drain_s)

    def bad(e: BadRequest):
        return JSONResponse(error_body(e.message, e.kind, e.param, e.status), status_code=e.status)

    async def generate(request, chat: bool):
        if st.stopping:
            return JSONResponse(error_body(SHUTDOWN_MESSAGE.split(":")[0] + ": no new requests.", "server_shutdown",
                                           code=503), status_code=503)
        if not engine.alive:
            return JSONResponse(error_body(f"the engine stopped: {engine.error or 'shutting down'}", "server_error",
                                           code=503), status_code=503)
        try:
            body = await read_json(request)
            if body is None:
                return Response(status_code=400)   # the client left mid-body: nobody reads this
            req = parse_request(body, chat=chat, served=name, max_len=max_len)
        except BadRequest as e:
            return bad(e)
        if st.inflight >= st.capacity:
            return JSONResponse(error_body(f"the server is full: {st.inflight} requests in flight (at most "
                                           f"{st.capacity}); retry later.", "server_busy", code=503),
                                status_code=503, headers={"retry-after": "1"})
        st.inflight += 1
        g = Generation(st, next(st.ids), req, chat)
        stop = () if req["ignore_eos"] else (ByteTokenizer.eos,)
        engine.submit(g.rid, req["prompt"], req["max_tokens"], g.sink(asyncio.get_running_loop()), stop_ids=stop,
                      min_tokens=req["min_tokens"])
        return g

    async def completions(request):
        return await generate(request, chat=False)

    async def chat_completions(request):
        return await generate(request, chat=True)

    async def models(request):
        return JSONResponse({"object": "list", "data": [{"id": name, "object": "model", "created": 0,
                                                         "owned_by": "roofline", "max_model_len": max_len,
                                                         **({"dtype": dtype} if dtype else {})}]})

    async def metrics(request):
        c = engine.counts
        lines = [f"roofline:num_requests_running {c['running']}", f"roofline:num_requests_waiting {c['waiting']}",
                 f"roofline:kv_slots_free {c['slots_free']}", f"roofline:requests_finished_total {c['finished']}",
                 f"roofline:requests_cancelled_total {c['cancelled']}", f"roofline:requests_in_flight {st.inflight}"]
        if engine.spec_k:
            sp = engine.spec
            lines += [f"roofline:spec_decode_num_drafts_total {sp['drafts']}",
                      f"roofline:spec_decode_num_draft_tokens_total {sp['draft_tokens']}",
                      f"roofline:spec_decode_num_accepted_tokens_total {sp['accepted']}"]
            lines += [f'roofline:spec_decode_num_accepted_tokens_per_pos_total{{position="{j}"}} {n}'
                      for j, n in enumerate(sp["per_position"])]
        return Response("\n".join(lines) + "\n", media_type="text/plain")

    async def health(request):
        return Response(status_code=200 if engine.alive else 503)

    async def tokenize(request):
        try:
            body = await read_json(request)
            if body is None:
                return Response(status_code=400)
            if not isinstance(body, dict):
                raise BadRequest("the request body must be a JSON object.")
            if "messages" in body:
                text = chat_prompt(body["messages"])
            else:
                text = body.get("prompt", body.get("content"))
                if not isinstance(text, str):
                    raise BadRequest("give 'prompt' (a string) or 'messages'.", "prompt")
            bos = _bool(body, "add_special_tokens", True)
        except BadRequest as e:
            return bad(e)
        ids = ByteTokenizer().encode(text, bos=bos)
        return JSONResponse({"count": len(ids), "max_model_len": max_len, "tokens": ids})

    async def http_error(request, exc: HTTPException):
        return JSONResponse(error_body(exc.detail, "invalid_request_error" if exc.status_code < 500 else
                                       "server_error", code=exc.status_code), status_code=exc.status_code)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        engine.start()
        try:
            yield
        finally:
            engine.stop()

    routes = [Route("/v1/completions", completions, methods=["POST"]),
              Route("/v1/chat/completions", chat_completions, methods=["POST"]),
              Route("/v1/models", models, methods=["GET"]), Route("/health", health, methods=["GET"]),
              Route("/tokenize", tokenize, methods=["POST"]), Route("/metrics", metrics, methods=["GET"])]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: http_error})
    app.state.roofline = st
    return app
