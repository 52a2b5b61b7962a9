"""``roofline serve``: our model behind an OpenAI-compatible API, so any client measures it from outside.

    roofline serve --model small --port 8000           # then, from anywhere on this machine:
    roofline latency --endpoint http://127.0.0.1:8000 --requests 16 --rate 8 --max-concurrency 8
    roofline serve --port 0                             # an ephemeral port: the first stdout line names it
    roofline serve --weight-dtype int8 --kv-dtype int8  # the same seeded weights, quantized at build time
    roofline serve --model tiny --spec 3 --draft tiny   # speculative decoding (greedy); /metrics counts it

The first stdout line is ``serving MODEL on http://HOST:PORT`` once the port is bound and the
model built (``--port 0`` picks a free port). The work is ``profiler.server``; this module checks
the options, builds the model and runs uvicorn until SIGINT or SIGTERM.
"""

from __future__ import annotations

import importlib.util
import signal
import socket
import sys
from dataclasses import dataclass

import click

from roofline.errors import RooflineError

from ..cli_args import float_dtype_option, model_option, quant_options, spec_options, threads_option, torch_device
from ..latency_run import build_draft, check_capacity, check_quant, check_spec
from ..run import cpu_threads_default
from ..server import GRACE_S, EngineThread, make_app
from ..serving import prefix_cache_for, warmup
from ..timing import cpu_threads

MAX_QUEUE = 1 << 16


@dataclass(frozen=True)
class ServeRun:
    """One ``roofline serve``: the model as built, the loop's settings and the API's limits, checked."""

    model: object                   # roofline.models.ModelConfig
    backend: str
    dtype: str
    device: str                     # torch device
    name: str                       # the id clients ask for
    budget: int | None              # token budget per step; None = whole prompts
    prefix_cache: bool
    block_size: int
    max_slots: int
    max_queue: int
    max_len: int
    seed: int = 0
    threads: int | None = None
    grace: float = GRACE_S          # seconds running requests get after SIGTERM / SIGINT
    weight_dtype: str | None = None
    kv_dtype: str | None = None
    group_size: int | None = None
    zero_point: bool = False
    spec: int = 0                   # draft tokens per verify step (0: no speculation)
    draft: object = None            # the draft's ModelConfig
    verify: str = "greedy"          # the server decodes greedily
    temperature: float = 1.0

    @property
    def quant(self) -> dict:
        return dict(weight_dtype=self.weight_dtype, kv_dtype=self.kv_dtype, group_size=self.group_size,
                    zero_point=self.zero_point)


def _need_extra():
    missing = [m for m in ("starlette", "uvicorn") if importlib.util.find_spec(m) is None]
    if missing:
        raise RooflineError(f"roofline serve needs the serve extra ({' and '.join(missing)} not installed): "
                            "pip install 'roofline[serve]'")


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on (host, port); port 0 = a free one. One-line errors for a taken port or a bad host."""
    if not 0 <= port <= 65535:
        raise RooflineError(f"--port must be from 0 (any free port) to 65535, but {port} was given.")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise RooflineError(f"--host {host!r} cannot be resolved ({e.strerror}).") from None
    family, kind, proto, _, addr = infos[0]
    # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted sockets only then, and without it
    # Nagle holds each streamed chunk back for the client's delayed ACK (40 ms on Linux)
    sock = socket.socket(family, kind, proto or socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        raise RooflineError(f"cannot listen on {host}:{port}: {e.strerror or e}"
                            + (" (another server holds that port: give another --port, or 0 for any free one)"
                               if e.errno == 98 else "") + ".") from None
    return sock


@click.command()
@model_option(default="small")
@click.option("--backend", type=click.Choice(["torch", "triton"]), default="torch", show_default=True)
@float_dtype_option("--dtype", "fp32", "the dtype the model runs in",
                    why="{key} is costed by `roofline explain`, not served; quantization: --weight-dtype, --kv-dtype")
@click.option("--device", "torch_device", default="auto", show_default=True, callback=torch_device,
              help="auto, cpu or cuda[:N]")
@click.option("--host", default="127.0.0.1", show_default=True, help="address to listen on (0.0.0.0: every one)")
@click.option("--port", type=int, default=8000, show_default=True, help="0 = any free port (printed)")
@click.option("--model-name", default=None, help="the id clients ask for (default: the model's name)")
@click.option("--chunk", default="64", show_default=True, help="token budget per step, or none (whole prompts)")
@click.option("--prefix-cache/--no-prefix-cache", default=None,
              help="reuse cached prompt blocks across requests  [default: on; off for a model with Gated DeltaNet or Mamba-2 "
              "layers, whose state is kept at a slot's end only]")
@click.option("--block-size", type=int, default=16, show_default=True, help="prefix-cache block (tokens)")
@click.option("--max-slots", type=int, default=8, show_default=True, help="KV-cache slots: most running requests")
@click.option("--max-queue", type=int, default=64, show_default=True,
              help="requests waiting beyond the slots; one more is answered 503")
@click.option("--max-model-len", type=int, default=None, help="tokens per sequence (default: the model's context, "
              "at most 4096)")
@click.option("--seed", type=int, default=0, show_default=True, help="seeds the weights")
@click.option("--shutdown-grace", type=float, default=None, help="seconds running requests get to finish after "
              "SIGTERM / SIGINT; the rest end with a shutdown event  [default: 3]")
@threads_option("CPU threads for torch; default on a CPU: one less than the cores")
@quant_options()
@spec_options
def serve(model, backend, dtype, torch_device, host, port, model_name, chunk, prefix_cache, block_size, max_slots,
          max_queue, max_model_len, seed, shutdown_grace, threads, weight_dtype, kv_dtype, group_size, zero_point,
          spec_k, draft):
    """Serve the model through our continuous-batching loop behind an OpenAI-compatible API."""
    _need_extra()
    grace = GRACE_S if shutdown_grace is None else shutdown_grace
    if not 0 <= grace <= 3600:
        raise RooflineError(f"--shutdown-grace must be from 0 to 3600 seconds, but {grace:g} was given.")
    budget = None if str(chunk).strip().lower() in ("none", "off") else _whole(chunk, "--chunk", 1, 1 << 20)
    if max_slots < 1 or max_slots > 4096:
        raise RooflineError(f"--max-slots must be from 1 to 4096, but {max_slots} was given.")
    if max_queue < 0 or max_queue > MAX_QUEUE:
        raise RooflineError(f"--max-queue must be from 0 to {MAX_QUEUE}, but {max_queue} was given.")
    max_len = max_model_len if max_model_len is not None else min(model.max_context, 4096)
    if not 2 <= max_len <= model.max_context:
        raise RooflineError(f"--max-model-len must be from 2 to {model.name}'s context of {model.max_context}, but "
                            f"{max_len} was given.")
    if block_size < 1 or block_size > max_len:
        raise RooflineError(f"--block-size must be from 1 to --max-model-len ({max_len}), but {block_size} was given.")
    if torch_device == "auto":
        import torch

        torch_device = "cuda" if torch.cuda.is_available() else "cpu"
    run = ServeRun(model=model, backend=backend, dtype=dtype, device=torch_device, name=model_name or model.name,
                   budget=budget, prefix_cache=prefix_cache_for(model, prefix_cache), block_size=block_size, max_slots=max_slots,
                   max_queue=max_queue, max_len=max_len, seed=seed, threads=threads, grace=grace,
                   weight_dtype=weight_dtype, kv_dtype=kv_dtype, group_size=group_size, zero_point=zero_point,
                   spec=spec_k or 0, draft=draft)
    check_spec(run)
    check_quant(run)
    check_capacity(run, max_len, max_len, "Give fewer --max-slots, a shorter --max-model-len")
    sock = bind(host, port)
    try:
        _run(sock, run)
    finally:
        sock.close()


def _whole(text, name: str, lo: int, hi: int) -> int:
    try:
        v = int(str(text).strip())
    except ValueError:
        raise RooflineError(f"{name} must be a whole number of tokens or none, not {text!r}.") from None
    if not lo <= v <= hi:
        raise RooflineError(f"{name} must be from {lo} to {hi}, but {v} was given.")
    return v


def _server_class():
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, except that a stop asked for by SIGINT or SIGTERM ends with status 0 after the
        graceful shutdown (uvicorn re-raises the signal, so the process would die by it), and the shutdown
        first tells the app (``State.begin_shutdown``): running requests get their drain time, then end with a
        shutdown event, all before uvicorn's own (longer) timeout would cancel them with a traceback."""

        def handle_exit(self, sig, frame):
            super().handle_exit(sig, frame)
            getattr(self, "_captured_signals", []).clear()

        async def shutdown(self, sockets=None):
            state = getattr(getattr(self.config.app, "state", None), "roofline", None)
            if state is not None:
                state.begin_shutdown()
            await super().shutdown(sockets)

    return Server


def _swallow_late_stops(server) -> None:
    """A second SIGTERM or SIGINT while the server winds down (after uvicorn put the previous handlers back)
    must not kill the process by the signal: a supervisor that repeats its stop would read the clean shutdown
    as a crash (exit -15). These handlers are the ones uvicorn saves and restores; before uvicorn takes over
    they ask the server to stop, after it let go they note the stop is already under way."""

    def late(sig, frame):
        server.should_exit = True

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, late)


def _run(sock, run: ServeRun) -> None:
    import uvicorn

    from kernels.model import LlamaModel   # kernels imports torch: deferred, the CLI starts without it

    _Server = _server_class()
    cfg, drain = run.model, run.grace
    with cpu_threads(cpu_threads_default(run.device, run.threads)) as n_threads:
        try:
            model = LlamaModel(cfg, dtype=run.dtype, backend=run.backend, device=run.device, seed=run.seed,
                               max_slots=run.max_slots, max_len=run.max_len, **run.quant)
        except RooflineError:
            raise
        except (ValueError, RuntimeError) as e:
            raise RooflineError(f"cannot build {cfg.name} ({run.backend}, {run.dtype}, {run.device}): {e}") from None
        warmup(model)
        draft = build_draft(run, model) if run.spec else None
        engine = EngineThread(model, chunk_budget=run.budget, prefix_cache=run.prefix_cache,
                              block_size=run.block_size, draft=draft, spec_k=run.spec)
        app = make_app(engine, name=run.name, max_len=run.max_len, capacity=run.max_slots + run.max_queue,
                       drain_s=drain, dtype=run.dtype)
        bound = sock.getsockname()
        shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
        click.echo(f"serving {run.name} on http://{shown}:{bound[1]}", nl=True)
        sys.stdout.flush()
        q = f", {model.quant_label}" if model.quant_label else ""
        click.echo(f"{cfg.name} ({run.backend}, {run.dtype}{q}, {run.device}, {n_threads} threads): chunk budget "
                   f"{run.budget or 'none'}, prefix cache {'on' if run.prefix_cache else 'off'}, {run.max_slots} "
                   f"slots, queue {run.max_queue}, max length {run.max_len}"
                   + (f", speculation K={run.spec} with draft {run.draft.name} (greedy)" if run.spec else "")
                   + ". Ctrl-C stops.", err=True)
        # the engine thread runs Python between kernels: a short switch interval keeps the event loop's
        # writes from waiting up to 5 ms (CPython's default) for the interpreter lock
        old = sys.getswitchinterval()
        sys.setswitchinterval(0.0005)
        try:
            config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=drain + 5.0,
                                    lifespan="on")
            server = _Server(config)
            _swallow_late_stops(server)
            server.run(sockets=[sock])
        finally:
            sys.setswitchinterval(old)
    click.echo("roofline serve: stopped.", err=True)
