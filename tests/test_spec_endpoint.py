"""``latency --endpoint`` reads a server's speculative-decoding counters from /metrics (profiler/spec_metrics.py).

A scripted server on 127.0.0.1 (an ephemeral port, uvicorn in a thread, stopped at the end of the module) streams
completions and serves /metrics in one of four flavours: vLLM's counters (already non-zero before the run, two
engines), SGLang's gauges, no speculation counters, no /metrics at all. Each request "verifies" three drafts of K = 3
with 3, 1 and 0 tokens accepted. Then ``roofline serve --spec``'s own /metrics (our engine, tiny models) read back.
"""

import asyncio
import json
import socket
import threading
import time

import pytest
from click.testing import CliRunner

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from profiler.cli import main  # noqa: E402
from profiler.spec_metrics import read_spec, samples, spec_delta  # noqa: E402
from roofline.records import read_results  # noqa: E402

ROUNDS = (3, 1, 0)           # accepted per draft of K = 3, per request
REQUESTS = 4


def _chunk(text, usage, finish=None):
    d = {"id": "x", "object": "text_completion", "model": "m",
         "choices": [{"index": 0, "text": text, "finish_reason": finish}],
         "usage": {"prompt_tokens": 8, "completion_tokens": usage, "total_tokens": 8 + usage}}
    return f"data: {json.dumps(d)}\n\n"


def metrics_text(state) -> str:
    f, c = state["flavour"], state["counts"]
    if f == "vllm":
        lines = ["# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.",
                 "# TYPE vllm:spec_decode_num_drafts_total counter"]
        for eng, share in (("0", 1), ("1", 0)):         # engine 1 idle: its zeros must sum in harmlessly
            lab = f'engine="{eng}",model_name="m"'
            lines += [f"vllm:spec_decode_num_drafts_total{{{lab}}} {(100 + c['drafts']) * share}.0",
                      f"vllm:spec_decode_num_drafts_created{{{lab}}} 1.7e9",
                      f"vllm:spec_decode_num_draft_tokens_total{{{lab}}} {(300 + c['drafted']) * share}.0",
                      f"vllm:spec_decode_num_accepted_tokens_total{{{lab}}} {(250 + c['accepted']) * share}.0"]
            lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{j}"}} '
                      f"{(90 + c['per_pos'][j]) * share}.0" for j in range(3)]
        return "\n".join(lines + ["vllm:num_requests_running{engine=\"0\"} 0.0"]) + "\n"
    if f == "sglang":
        return 'sglang:spec_accept_length{model_name="m"} 2.5\nsglang:spec_accept_rate{model_name="m"} 0.5\n'
    return "vllm:num_requests_running 0.0\n"


def make_app(state):
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
    from starlette.routing import Route

    async def models(request):
        return JSONResponse({"object": "list", "data": [{"id": "m"}]})

    async def stream():
        for i in range(3):
            yield _chunk("ab"[i % 2], i + 1)
        yield _chunk("", 3, finish="length")
        yield "data: [DONE]\n\n"

    async def completions(request):
        await request.json()
        c = state["counts"]
        for a in ROUNDS:
            c["drafts"] += 1
            c["drafted"] += 3
            c["accepted"] += a
            for j in range(a):
                c["per_pos"][j] += 1
        return StreamingResponse(stream(), media_type="text/event-stream")

    async def metrics(request):
        if state["flavour"] == "absent":
            return Response(status_code=404)
        return PlainTextResponse(metrics_text(state))

    return Starlette(routes=[Route("/v1/models", models), Route("/v1/completions", completions, methods=["POST"]),
                             Route("/metrics", metrics)])


@pytest.fixture(scope="module")
def server():
    import uvicorn

    state = {"flavour": "vllm", "counts": {"drafts": 0, "drafted": 0, "accepted": 0, "per_pos": [0, 0, 0]}}
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    srv = uvicorn.Server(uvicorn.Config(make_app(state), log_level="warning", timeout_graceful_shutdown=1))
    th = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    th.start()
    deadline = time.monotonic() + 10
    while not srv.started and time.monotonic() < deadline:
        time.sleep(0.01)
    assert srv.started
    state["url"] = f"http://127.0.0.1:{sock.getsockname()[1]}"
    yield state
    srv.should_exit = True
    th.join(10)
    sock.close()
    assert not th.is_alive()


def run(server, tmp_path, flavour):
    server["flavour"] = flavour
    out = tmp_path / flavour
    r = CliRunner().invoke(main, ["latency", "--endpoint", server["url"], "--requests", REQUESTS, "--rate", "1000",
                                  "--prompt-tokens", "8", "--output-tokens", "3", "--out", str(out), "--json"])
    return r, out / "latency.jsonl"


def test_vllm_counters_give_the_runs_acceptance_beside_tpot(server, tmp_path):
    r, path = run(server, tmp_path, "vllm")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    sp = doc["summaries"][0]["speculation"]
    n = REQUESTS * len(ROUNDS)
    assert (sp["drafts"], sp["drafted"], sp["accepted"]) == (n, 3 * n, REQUESTS * 4)   # the deltas, not totals
    assert sp["acceptance"] == pytest.approx(4 / 9)
    assert sp["tokens_per_step"] == pytest.approx(1 + 4 / 3)
    assert sp["per_position"] == pytest.approx([2 / 3, 1 / 3, 1 / 3])
    assert "vllm:spec_decode_* counters" in sp["source"]
    assert doc["summaries"][0]["tpot"]["n"] == REQUESTS
    s = read_results(path).summaries[0]                      # the file keeps it
    assert s.speculation["accepted"] == REQUESTS * 4


def test_the_printed_report_says_acceptance_beside_tpot(server, tmp_path):
    server["flavour"] = "vllm"
    r = CliRunner().invoke(main, ["latency", "--endpoint", server["url"], "--requests", 2, "--rate", "1000",
                                  "--prompt-tokens", "8", "--output-tokens", "3", "--out", str(tmp_path / "p")])
    assert r.exit_code == 0, r.output
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("speculation ("))
    assert "acceptance 0.444 (8/18 draft tokens over 6 drafts), 2.33 tokens per verify step" in line
    assert "per position 0.67 / 0.33 / 0.33" in line
    row = next(ln for ln in r.stdout.splitlines() if ln.startswith("endpoint=completions"))
    assert "0.444" in row and "2.33" in row


def test_sglang_gauges_are_read_after_the_run(server, tmp_path):
    r, _ = run(server, tmp_path, "sglang")
    assert r.exit_code == 0, r.output
    sp = json.loads(r.stdout)["summaries"][0]["speculation"]
    assert (sp["accept_length"], sp["accept_rate"]) == (2.5, 0.5)
    assert "SGLang's gauges" in sp["source"]


@pytest.mark.parametrize("flavour, said", [("none", "/metrics has no speculative-decoding counters"),
                                           ("absent", "offers no /metrics")])
def test_a_server_without_counters_is_one_line_not_an_error(server, tmp_path, flavour, said):
    r, _ = run(server, tmp_path, flavour)
    assert r.exit_code == 0, r.output
    notes = [ln for ln in r.stderr.splitlines() if said in ln]
    assert len(notes) == 1 and notes[0].startswith("note: ")
    assert json.loads(r.stdout)["summaries"][0]["speculation"] == {}


def test_prometheus_parsing_and_deltas():
    text = ('# TYPE x counter\nvllm:spec_decode_num_drafts_total{engine="0"} 4\n'
            'vllm:spec_decode_num_drafts_total{engine="1"} 6\nvllm:spec_decode_num_draft_tokens_total 30\n'
            'vllm:spec_decode_num_accepted_tokens_total 12\nnot a sample line\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="1",engine="0"} 5\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="0",engine="0"} 7\n')
    assert samples("a{b=\"c\",d=\"e\"} 1.5\n# c\n")[0] == ("a", {"b": "c", "d": "e"}, 1.5)
    after = read_spec(text)
    assert after == {"engine": "vllm", "drafts": 10.0, "draft_tokens": 30.0, "accepted": 12.0,
                     "per_position": {0: 7.0, 1: 5.0}}
    d = spec_delta(None, after)                              # no reading before: the counters from zero
    assert d["acceptance"] == 0.4 and d["tokens_per_step"] == 2.2 and d["per_position"] == [0.7, 0.5]
    assert spec_delta(after, after)["drafts"] == 0
    assert read_spec("vllm:num_requests_running 1\n") is None and spec_delta(None, None) == {}


def test_our_server_exports_its_speculation_counters():
    from starlette.testclient import TestClient

    from kernels.model import LlamaModel
    from profiler.server import EngineThread, make_app as serve_app
    from roofline.models import load_model

    cfg = load_model("tiny")
    target, draft = (LlamaModel(cfg, dtype="fp32", backend="torch", seed=0, max_slots=2, max_len=64)
                     for _ in range(2))                      # the same seed: the draft is the target
    eng = EngineThread(target, draft=draft, spec_k=3)
    with TestClient(serve_app(eng, name="tiny", max_len=64, capacity=4)) as c:
        r = c.post("/v1/completions", json={"prompt": "hello there", "max_tokens": 9, "ignore_eos": True})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 9
        sp = None
        for _ in range(50):                                  # the engine thread counts after its step
            sp = read_spec(c.get("/metrics").text)
            if sp and sp["drafts"] == 2:
                break
            time.sleep(0.02)
    # 9 tokens: the first from the prefill, then 2 rounds of 3 drafts + 1, every draft accepted
    assert sp == {"engine": "roofline", "drafts": 2.0, "draft_tokens": 6.0, "accepted": 6.0,
                  "per_position": {0: 2.0, 1: 2.0, 2: 2.0}}
