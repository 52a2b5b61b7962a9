"""``roofline latency --endpoint``: measure an OpenAI-compatible server from outside, into a latency file.

    from profiler.endpoint_run import EndpointRun, run_endpoint
    result = run_endpoint(EndpointRun("http://127.0.0.1:8000", requests=16, rate=8, concurrency=(4,)))
    print(result.summaries[0].ttft["p50"])

The same file and rules as an in-process run (``profiler.run.run_configs`` is shared): a
``RunHeader`` of kind "latency" (the device is the server, unknown to the client; the model
config, when given, describes what is served so ``roofline diagnose`` can put a floor under
each latency), then per configuration (one per concurrency limit) one ``request`` line per
request the moment it finishes, ok or failed, and a ``latency-summary`` line. A resumed run
skips complete configurations; Ctrl-C raises ``profiler.run.Interrupted`` after the file is
closed. The API key is never written: not in the header, not in the recorded command.

Before anything is measured: the URL is checked, ``GET /v1/models`` names the model (the
first one listed unless ``model_name`` is given), and each prompt is sized to the requested
token count with the server's ``/tokenize`` where offered (else it is ``prompt_tokens - 1``
characters, one token each in our byte tokenizer; the usage report gives the served count).

Speculative decoding: ``GET /metrics`` is read before and after each configuration; the server's
speculative-decoding counters (``profiler.spec_metrics``: vLLM's ``vllm:spec_decode_*``, SGLang's
``sglang:spec_accept_*`` gauges) give the run's acceptance and tokens per verify step, kept in the summary's
``speculation`` beside its TPOT. A server without them is said in one line. The counters are the server's: other
clients' requests during the run count too.
"""

from __future__ import annotations

import asyncio
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path

from roofline.devices import Device
from roofline.errors import RooflineError
from roofline.latency import arrival_times, format_slo, summarize
from roofline.records import RunHeader

from .endpoint import (Target, base_url, chars_per_token, discover, public_url, run_requests, served_dtype,
                       sized_prompt)
from .probes import git_sha, light_versions
from .run import LatencyResult, check_output, check_writable, command_line, quiet, run_configs, started
from .spec_metrics import NO_COUNTERS, fetch_metrics, read_spec, spec_delta
from .timing import now
from .tokenizer import make_prompt

DISCOVERY_TIMEOUT_S = 30.0   # GET /v1/models and /tokenize before the run: a server that accepts and never answers
TIMESTAMPS = ("profiler.timing.now() on the client, seconds since the configuration started; arrival = scheduled "
              "offset; queue = arrival -> sent (the wait for a concurrency slot); a chunk's time = its event parsed")


@dataclass(frozen=True)
class EndpointRun:
    """One ``roofline latency --endpoint`` run: the server, the requests, the configurations, where it goes."""

    url: str
    api: str = "completions"          # "completions" | "chat"
    model_name: str = ""              # the request's "model"; "" = the first of GET /v1/models
    model: object = None              # a roofline ModelConfig describing the served model (floors), optional
    model_arg: str = ""
    dtype: str = ""                   # the served dtype as the user says it (floors); "": the server's, else bf16
    prompt_tokens: int = 256
    output_tokens: int = 32
    requests: int = 8
    rate: float = 4.0
    arrival: str = "poisson"
    seed: int = 0
    shared_prefix: int = 0
    concurrency: tuple = (None,)      # one configuration each: most requests in flight (None = no limit)
    timeout: float = 600.0
    connect_timeout: float = 10.0
    ignore_eos: bool = True
    usage_per_chunk: bool = True
    slo: dict = field(default_factory=dict)
    out: Path = Path("roofline-out")
    mode: str = "new"
    api_key: str | None = field(default=None, repr=False)

    def __post_init__(self):
        check_output(self)

    @property
    def path(self) -> Path:
        return self.out / "latency.jsonl"

    @property
    def configs(self) -> list:
        return [(c, config_label(self.api, c)) for c in self.concurrency]

    def settings(self, model_name: str) -> dict:
        return {"endpoint": public_url(self.url), "api": self.api, "model_name": model_name, "prompt_tokens": self.prompt_tokens,
                "output_tokens": self.output_tokens, "requests": self.requests, "rate": self.rate,
                "arrival": self.arrival, "seed": self.seed, "shared_prefix": self.shared_prefix,
                "max_concurrency": [c or 0 for c in self.concurrency], "timeout_s": self.timeout,
                "connect_timeout_s": self.connect_timeout, "ignore_eos": self.ignore_eos,
                "usage_per_chunk": self.usage_per_chunk, "slo": dict(self.slo), "timestamps": TIMESTAMPS}

    def command(self, resume: bool = False) -> str:
        args = ["roofline", "latency", "--endpoint", public_url(self.url), "--api", self.api]
        if self.model_name:
            args += ["--model-name", self.model_name]
        if self.model is not None:
            args += ["--model", self.model_arg or self.model.name] + (["--dtype", self.dtype] if self.dtype else [])
        args += ["--prompt-tokens", str(self.prompt_tokens), "--output-tokens", str(self.output_tokens),
                 "--requests", str(self.requests), "--rate", f"{self.rate:g}", "--arrival", self.arrival,
                 "--seed", str(self.seed), "--shared-prefix", str(self.shared_prefix),
                 "--max-concurrency", ",".join(str(c or "none") for c in self.concurrency),
                 "--timeout", f"{self.timeout:g}", "--connect-timeout", f"{self.connect_timeout:g}",
                 "--ignore-eos" if self.ignore_eos else "--no-ignore-eos",
                 "--usage-per-chunk" if self.usage_per_chunk else "--no-usage-per-chunk", "--out", str(self.out)]
        if self.slo:
            args += ["--slo", format_slo(self.slo)]
        args += ["--resume"] if resume else (["--overwrite"] if self.mode == "overwrite" else [])
        return shlex.join(args)      # never the API key: it comes from OPENAI_API_KEY or --api-key again


def config_label(api: str, concurrency) -> str:
    return f"endpoint={api},concurrency={concurrency or 'unlimited'}"


def _server_device(model_name: str, base: str):
    return Device(key="endpoint", name=f"{public_url(base)} serving {model_name}", kind="server", source="unknown",
                  provenance="measured from a client: the server's device and ceilings are not known to it; give "
                             "`roofline diagnose --device` for the floors")


async def _prepare(run: EndpointRun, target, say) -> tuple:
    """(model name, prompts [(text, requested tokens, max_tokens)], the dtype the server lists or None): discovery
    and prompt sizing."""
    async with target.client(timeout=min(target.timeout, DISCOVERY_TIMEOUT_S)) as client:
        name, ids = await discover(client, target.base, run.model_name)
        if not run.model_name and len(ids) > 1:
            say(f"note: {public_url(target.base)} serves {len(ids)} models; measuring the first, {name!r} (--model-name picks)")
        dtype = await served_dtype(client, name)
        per = await chars_per_token(client, name, make_prompt(max(run.prompt_tokens, 256), seed=run.seed * 1000))
        shared = round(max(run.shared_prefix - 1, 0) * (per or 1.0))      # the shared prefix, in characters
        prompts = []
        for i in range(run.requests):
            def make(chars, i=i):
                return make_prompt(chars + 1, seed=run.seed * 1000 + i, shared_prefix=min(shared, chars) + 1)
            text, _ = await sized_prompt(client, name, run.prompt_tokens, make, per, chat=run.api == "chat")
            prompts.append((text, run.prompt_tokens, run.output_tokens))
    if per is None:
        say(f"note: {public_url(target.base)} offers no /tokenize: each prompt is {run.prompt_tokens - 1} characters (one token "
            "each in our byte tokenizer); the served prompt lengths come from the usage reports.")
    return name, prompts, dtype


def dtype_of(given: str, served: str | None) -> tuple:
    """(the served dtype for the floors, where it came from): --dtype, else what the server lists, else bf16 assumed."""
    if given:
        return given, "given with --dtype"
    if served:
        return served, "listed by the server (GET /v1/models)"
    return "bf16", "assumed: neither --dtype nor the server named it"


def run_endpoint(run: EndpointRun, *, say=quiet) -> LatencyResult:
    """Send ``run.requests`` requests per configuration to the server; write each request as it finishes."""
    base = base_url(run.url)
    if run.api not in ("completions", "chat"):
        raise RooflineError(f"--api must be completions or chat, not {run.api!r}.")
    check_writable(run.out)
    target = Target(base, run.api, run.model_name, run.timeout, run.connect_timeout, run.ignore_eos,
                    run.usage_per_chunk, run.api_key)
    t = now()
    name, prompts, served = asyncio.run(_prepare(run, target, say))
    dtype, dtype_from = dtype_of(run.dtype, served)
    say(f"{public_url(base)}: model {name!r}; prompts sized in {now() - t:.1f} s")
    target = Target(base, run.api, name, run.timeout, run.connect_timeout, run.ignore_eos, run.usage_per_chunk,
                     run.api_key)
    header = RunHeader(device=_server_device(name, base), model=run.model, kind="latency", dtype=dtype,
                       settings={**run.settings(name), "dtype_from": dtype_from}, versions=light_versions("httpx"),
                       git_sha=git_sha(), command=command_line(run.command(run.mode == "resume")), started=started())
    arrivals = arrival_times(run.requests, run.rate, run.arrival, run.seed)
    concurrency = {label: c for c, label in run.configs}

    said = []

    def one(label, sink):
        c = concurrency[label]
        say(f"running {label}: {run.requests} requests to {name!r} at {public_url(base)}")
        before = asyncio.run(_metrics(target))
        ts = asyncio.run(run_requests(target, prompts, arrivals, concurrency=c, config=label,
                                      on_finish=sink.request))
        after = asyncio.run(_metrics(target))
        spec = spec_delta(read_spec(before), read_spec(after), f"{public_url(base)}/metrics")
        if not spec and not said:
            said.append(True)
            say(f"note: {public_url(base)} " + ("offers no /metrics: acceptance not reported" if after is None
                                                else f"/metrics {NO_COUNTERS}") + ".")
        beyond = sum(t.token_counts == "usage beyond the request" for t in ts)
        if beyond:
            say(f"note: {beyond} of {len(ts)} requests reported usage beyond the {run.output_tokens} tokens asked for "
                "(completion_tokens up to {:,}); their tokens are counted one per output chunk, not from the "
                "usage.".format(max(t.served_output_tokens or 0 for t in ts)))
        s = summarize(ts, run.slo, label, {"api": run.api, "max_concurrency": c or 0, "model_name": name,
                                           "token_counts": _token_rules(ts)})
        return replace(s, speculation=spec) if spec else s

    return run_configs(run.path, run.mode, header, list(concurrency), one, say=say,
                       resume=lambda: run.command(resume=True))


async def _metrics(target) -> str | None:
    """The server's ``/metrics`` text now, or None (``profiler.spec_metrics.fetch_metrics``; a server that trickles
    it for longer than ``DISCOVERY_TIMEOUT_S`` in all is None too)."""
    wait = min(target.timeout, DISCOVERY_TIMEOUT_S)
    async with target.client(timeout=wait) as client:
        try:
            return await asyncio.wait_for(fetch_metrics(client), wait)
        except asyncio.TimeoutError:
            return None


def _token_rules(ts) -> dict:
    """How many requests had their tokens per chunk counted by each rule (``roofline.latency.TOKEN_COUNTS``)."""
    out: dict = {}
    for t in ts:
        if t.token_counts:
            out[t.token_counts] = out.get(t.token_counts, 0) + 1
    return out
