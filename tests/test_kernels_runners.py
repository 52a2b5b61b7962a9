"""Profiling runners: every op of a phase, costs equal roofline.workload's, fn runs on the tiny model.

Run: pytest tests/test_kernels_runners.py
"""

import pytest
import torch

import kernels  # noqa: F401
from kernels.runners import make_runners
from roofline import workload as W
from roofline.cost import ZERO
from roofline.errors import RooflineError
from roofline.models import load_model

TINY = load_model("tiny")


@pytest.mark.parametrize("phase,batch,context", [("prefill", 2, 19), ("decode", 3, 21)])
@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_runners_cover_ops_costs_match_and_run(phase, batch, context, backend):
    rs = make_runners(TINY, phase, batch, context, dtype="bf16", backend=backend)
    assert [r.name for r in rs] == list(W.op_names(TINY)) + ["layer"]
    ph = (W.prefill if phase == "prefill" else W.decode)(TINY, batch, context)
    for r in rs:
        if r.name == "layer":
            assert r.cost == sum((ph.op(n).cost for n in W.op_names(TINY) if W.op_spec(TINY, n).per_layer), ZERO)
            assert r.compute_dtype == "bf16"
        else:
            assert r.cost == ph.op(r.name).cost
            assert r.compute_dtype == ph.op(r.name).compute_dtype
        assert r.config["backend"] == backend
        out = r.fn()
        if r.name in ("q_proj", "o_proj", "lm_head", "swiglu", "attention", "layer"):
            assert torch.isfinite(out).all()
    shapes = {r.name: r.fn() for r in rs if r.name in ("q_proj", "attention", "lm_head", "layer")}
    T = batch * (context if phase == "prefill" else 1)
    assert shapes["q_proj"].shape == (T, TINY.q_dim)
    assert shapes["lm_head"].shape == (batch, TINY.vocab)
    assert shapes["layer"].shape == (T, TINY.hidden)
    assert tuple(shapes["attention"].shape) == (T, TINY.n_heads, TINY.head_dim)  # o: [T, Hq, D]


def test_decode_attention_cost_is_over_context_plus_one():
    (r,) = make_runners(TINY, "decode", 2, 10, dtype="fp32", ops=["attention"])
    # 4 * B * Hq * (context + 1) * D = 4 * 2 * 4 * 11 * 16
    assert r.cost.flops == 4 * 2 * 4 * 11 * 16
    assert r.config["splits"] >= 1 and r.config["block_n"] == 32     # fp32 takes 32-key tiles (spill-free)


def test_linear_runner_config_is_the_skinny_path():
    (r,) = make_runners(TINY, "decode", 1, 5, dtype="bf16", ops=["down_proj"])
    assert r.config["block_m"] == 16 and r.config["dtype"] == "bf16"
    assert r.cost.flops == 2 * 1 * TINY.intermediate * TINY.hidden


def test_bad_arguments():
    with pytest.raises(RooflineError, match="unknown op 'qkv'"):
        make_runners(TINY, "decode", 1, 4, ops=["qkv"])
    with pytest.raises(RooflineError, match="phase must be one of prefill, decode, verify, not 'train'"):
        make_runners(TINY, "train", 1, 4)
    with pytest.raises(RooflineError, match="a verify step needs spec_k"):
        make_runners(TINY, "verify", 1, 4)
    with pytest.raises(RooflineError, match="only a verify step takes one"):
        make_runners(TINY, "decode", 1, 4, spec_k=3)
