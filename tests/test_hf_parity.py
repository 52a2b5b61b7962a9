"""Logits parity with transformers on tiny real checkpoints of every supported model_type (issue 20).

Each checkpoint is built by transformers' own ``save_pretrained`` (tests/hf_tiny.py: biases, qk-norm,
windows shorter than the prompts, GeGLU, (1 + w) norms, softcaps, fused projections, tied embeddings),
loaded by ``load_model(folder)`` + ``kernels.checkpoint`` into our model, and run through our prefill,
decode, chunked prefill and prefix reuse, past the window; every logit row is compared with
transformers' fp32 logits at 1e-4 of the largest logit. These are the tests that catch a dropped
bias, an ignored window or a wrong norm convention.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hf_tiny as H
from kernels.model import LlamaModel
from roofline.models import load_model

TOL = 1e-4
N = H.TOKENS          # 20 tokens: past every fixture's window of 8


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    cache = {}

    def get(model_type):
        if model_type not in cache:
            H.require(model_type)
            folder = H.build_checkpoint(model_type, tmp_path_factory.mktemp(model_type))
            seq = H.tokens(N)
            cache[model_type] = (folder, H.reference_logits(folder, seq, prompt=H.PROMPT, steps=0))
        return cache[model_type]
    return get


def close(ours, theirs):
    ours = np.asarray(ours.detach() if isinstance(ours, torch.Tensor) else ours, dtype=np.float64)
    scale = np.abs(theirs).max()
    err = np.abs(ours - theirs).max() / scale
    assert err < TOL, f"max |ours - transformers| = {err:.2e} of the largest logit"


def model(folder, backend="torch"):
    cfg = load_model(folder)
    assert cfg.checkpoint, "the folder's *.safetensors must be found"
    return LlamaModel(cfg, dtype="fp32", backend=backend, max_slots=3, max_len=N + 2)


@pytest.mark.parametrize("model_type", H.MODEL_TYPES)
def test_prefill_then_decode_past_the_window(built, model_type):
    folder, ref = built(model_type)
    m = model(folder)
    assert m.weights_info["weights"] == "checkpoint" and len(m.weights_info["sha256"]) == 64
    seq = torch.tensor(ref.sequence)
    close(m.prefill(seq[: ref.prompt], 0), ref.decode[ref.prompt - 1])
    for pos in range(ref.prompt, N):
        close(m.decode_step(seq[pos: pos + 1], [0])[0], ref.decode[pos])
    close(m.forward_full(seq[None]), ref.prefill)


@pytest.mark.parametrize("model_type", H.MODEL_TYPES)
def test_chunked_prefill_and_prefix_reuse(built, model_type):
    folder, ref = built(model_type)
    m = model(folder)
    seq = torch.tensor(ref.sequence)
    for start in range(0, N - 3, 3):                     # chunks of 3, then the rest with logits
        m.prefill(seq[start: start + 3], 0, logits=False)
    close(m.prefill(seq[start + 3:], 0), ref.prefill[N - 1])
    # slot 1 reuses slot 0's first 12 tokens (past the window) and prefills the other 8
    close(m.prefill_with_prefix(seq, 1, 0, 12), ref.prefill[N - 1])


@pytest.mark.parametrize("model_type", ["qwen2", "phi3", "gemma2", "gemma3_text", "seed_oss", "olmo3", "exaone4"])
def test_triton_kernels_match_transformers(built, model_type):
    """Our Triton kernels (interpreted here) on the real weights: a windowed, biased, softcapped decode."""
    folder, ref = built(model_type)
    m = model(folder, "triton")
    seq = torch.tensor(ref.sequence)
    close(m.prefill(seq[:12], 0), ref.decode[11])
    for pos in range(12, 14):
        close(m.decode_step(seq[pos: pos + 1], [0])[0], ref.decode[pos])


def test_random_weights_without_files(tmp_path):
    folder = tmp_path / "cfg"
    folder.mkdir()
    H.tiny_config("qwen2").to_json_file(folder / "config.json")
    cfg = load_model(folder)
    m = LlamaModel(cfg, dtype="fp32", backend="torch", max_slots=1, max_len=8)
    assert cfg.checkpoint == "" and m.weights_info == {"weights": "random (seed 0)"}
    assert m.w["layers"][0]["bq"].shape == (cfg.q_dim,)     # the biases exist, random


def test_runners_time_the_checkpoint_and_the_run_records_it(built):
    from kernels.runners import make_runners
    from profiler.sweep import SweepPlan

    folder, _ = built("gemma2")
    cfg = load_model(folder)
    rs = {r.name: r for r in make_runners(cfg, "decode", 2, 12, dtype="fp32", backend="torch")}
    assert set(rs) >= {"attention", "attention_sliding", "geglu", "embed_scale", "final_softcap", "post_mlp_norm"}
    assert rs["attention_sliding"].config["window"] == H.WINDOW and rs["attention"].config.get("window") is None
    assert rs["final_softcap"].fn().shape == (2, cfg.vocab)
    settings = SweepPlan(cfg, phases=("decode",), batches=(1,), contexts=(8,), backends=("torch",),
                         dtype="fp32").settings()
    assert settings["weights"]["weights"] == "checkpoint" and len(settings["weights"]["sha256"]) == 64
    assert settings["weights"]["files"] == ["model.safetensors"]


def test_a_checkpoint_that_does_not_match_its_config_is_refused(built, tmp_path):
    import json
    import shutil

    from roofline.errors import RooflineError

    folder, _ = built("qwen2")
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    d = json.loads((bad / "config.json").read_text())
    d["model_type"] = "llama"            # the same sizes read as a Llama: the q/k/v biases are read by no op
    (bad / "config.json").write_text(json.dumps(d))
    with pytest.raises(RooflineError, match="llama: layer_types = .* is not a field roofline knows for llama"):
        load_model(bad)                  # Qwen2's window keys are no Llama's: refused before any weight is read
    with pytest.raises(RooflineError, match="holds tensors no op of a llama model reads: model.layers.0.self_attn"):
        LlamaModel(load_model(bad, allow_unknown_fields=True), dtype="fp32", backend="torch", max_slots=1, max_len=8)
    d["model_type"], d["hidden_size"] = "qwen2", 32
    (bad / "config.json").write_text(json.dumps(d))
    with pytest.raises(RooflineError, match="has shape .* where the config says"):
        LlamaModel(load_model(bad), dtype="fp32", backend="torch", max_slots=1, max_len=8)
