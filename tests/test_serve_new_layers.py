"""`roofline serve` on the new layer kinds (issue 32): a tiny Gated DeltaNet hybrid (qwen3_next), a tiny DeepSeek
Sparse Attention model (deepseek_v32; both tests/hf_tiny_moe.py) and a tiny Mamba-2 hybrid (nemotron_h,
tests/hf_tiny_mamba.py), transformers' own checkpoints, served over HTTP on 127.0.0.1: each completion equals the
in-process engine's greedy text for the same prompt (the engine whose model is checked against transformers' logits
in tests/test_hf_parity_hybrid.py, test_hf_parity_moe.py, test_hf_parity_mamba.py), and the hybrids are served with
their prefix cache off (their default; the start line says so)."""
from __future__ import annotations

import importlib.util

import pytest

pytest.importorskip("transformers")
if importlib.util.find_spec("uvicorn") is None or importlib.util.find_spec("httpx") is None:
    pytest.skip("roofline serve needs the serve extra (fastapi, uvicorn, httpx)", allow_module_level=True)

import httpx  # noqa: E402

import hf_tiny_mamba as HM  # noqa: E402
import hf_tiny_moe as H  # noqa: E402
from kernels.model import LlamaModel  # noqa: E402
from profiler.serving import RequestSpec, serve  # noqa: E402
from roofline.models import load_model  # noqa: E402
from test_serve import start_server, stop  # noqa: E402

PROMPTS = ("a hybrid", "keeps its state and")


@pytest.mark.parametrize("model_type, cache", [("qwen3_next", "off"), ("deepseek_v32", "on"), ("nemotron_h", "off")])
def test_served_completions_equal_the_in_process_engine(model_type, cache, tmp_path):
    folder = (HM if model_type == "nemotron_h" else H).checkpoint(model_type)
    m = LlamaModel(load_model(folder), dtype="fp32", backend="torch", max_slots=2, max_len=64)
    local = serve(m, [RequestSpec(i, 0.0, p, 5) for i, p in enumerate(PROMPTS)]).texts
    p, url = start_server(tmp_path, "--model", str(folder), "--backend", "torch", "--dtype", "fp32",
                          "--device", "cpu", "--max-slots", "2", "--max-model-len", "64")
    try:
        for i, prompt in enumerate(PROMPTS):
            r = httpx.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": 5}, timeout=120)
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["usage"]["completion_tokens"] == 5
            assert body["choices"][0]["text"] == local[i], (model_type, prompt)
    finally:
        assert stop(p) == 0
    assert f"prefix cache {cache}," in (tmp_path / "serve.err").read_text()
