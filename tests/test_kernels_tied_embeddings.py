"""Tied embeddings: lm_head is embed.t(), a transposed view, and the Triton linear takes any strides.

Runs on CPU under the Triton interpreter (tests/conftest.py sets TRITON_INTERPRET=1); shapes are tiny.
Run: pytest tests/test_kernels_tied_embeddings.py
"""

import json
from dataclasses import replace

import pytest
import torch

import kernels  # noqa: F401
from kernels.linear import linear
from kernels.model import LlamaModel
from kernels.runners import make_runners
from roofline.models import load_model

TIED = replace(load_model("tiny"), name="tiny-tied", tie_embeddings=True)


@pytest.mark.parametrize("M, K, N, config", [
    (3, 40, 72, {}),                                             # decode-shaped: split-K path
    (70, 24, 40, {}),                                            # prefill-shaped: M > 64, one split
    (5, 50, 33, {"block_m": 16, "block_n": 16, "block_k": 16, "split_k": 2}),
])
def test_linear_takes_a_transposed_weight(M, K, N, config):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(M, K, generator=g)
    w = torch.randn(N, K, generator=g)                           # stored [N, K]; used as w.t(): [K, N]
    wt = w.t()
    assert not wt.is_contiguous() and wt.stride() == (1, K)
    y = linear(x, wt, **config)
    torch.testing.assert_close(y, x @ wt, rtol=1e-5, atol=1e-5)


def test_linear_takes_a_strided_slice():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 20, generator=g)
    w = torch.randn(20, 60, generator=g)[:, ::3]                  # [20, 20], stride (60, 3)
    torch.testing.assert_close(linear(x, w), x @ w, rtol=1e-5, atol=1e-5)


def test_tied_model_triton_equals_torch():
    toks = torch.tensor([3, 14, 15, 92, 65])
    out = {}
    for be in ("triton", "torch"):
        m = LlamaModel(TIED, dtype="fp32", backend=be, max_slots=1, max_len=16, seed=2)
        assert m.w["lm_head"].data_ptr() == m.w["embed"].data_ptr()   # really tied: one tensor
        pre = m.prefill(toks, 0)
        dec = m.decode_step(m.greedy(pre).view(1), torch.tensor([0]))
        out[be] = (pre, dec)
    for a, b in zip(out["triton"], out["torch"]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_tied_config_json_runs_the_triton_lm_head(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2,
                             "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
                             "max_position_embeddings": 512, "tie_word_embeddings": True}))
    cfg = load_model(str(p))
    assert cfg.tie_embeddings is True
    for phase in ("decode", "prefill"):
        (r,) = make_runners(cfg, phase, batch=2, context=4, dtype="fp32", backend="triton", ops=["lm_head"])
        (ref,) = make_runners(cfg, phase, batch=2, context=4, dtype="fp32", backend="torch", ops=["lm_head"])
        y = r.fn()
        assert r.name == "lm_head" and tuple(y.shape) == (2, 256)
        torch.testing.assert_close(y, ref.fn(), rtol=1e-5, atol=1e-5)   # same seed, same inputs
