"""Mamba-2 layers in our model (issue 32): ``kernels.model.mamba_mixer`` with its per-layer, per-slot state cache (the
conv state [S, C, K - 1] in the activation dtype, the SSM state [S, H, P, N] fp32), on random weights of a toy
Granite-4.0-H-like hybrid (Mamba-2 on layers 0 and 2, attention without RoPE on 1, every layer with its SwiGLU MLP):
a cached prefill (past one chunk of 16), decode, chunked prefill, several slots decoded together at different lengths
and prefix reuse of a whole cached sequence all give forward_full's logits, on both backends (Triton interpreted), the
two backends agree, and a shorter prefix is refused in one line naming the layer kind. transformers' parity on real
checkpoints is tests/test_hf_parity_mamba.py's."""

from __future__ import annotations

import pytest
import torch

from kernels.model import LlamaModel
from roofline.errors import RooflineError
from roofline.models import ModelConfig

TOL = 2e-6          # fp32: the cached paths against forward_full, relative to the largest logit

TOY = ModelConfig("toy-mamba2", 64, 96, 3, 4, 2, 256, 512, head_dim=16, arch="granitemoehybrid",
                  layer_types=("mamba", "full", "mamba"), nope_layers=(1,), mamba_heads=4, mamba_head_dim=8,
                  mamba_state=8, mamba_groups=2, mamba_conv=4, mamba_chunk=16, mamba_conv_bias=True,
                  mamba_proj_bias=True, mamba_dt_min=0.001)
SEQ = torch.randint(3, 256, (22,), generator=torch.Generator().manual_seed(0))


def err(ours, ref) -> float:
    return float((ours - ref).abs().max() / ref.abs().max())


@pytest.fixture(scope="module", params=["torch", "triton"])
def run(request):
    m = LlamaModel(TOY, dtype="fp32", backend=request.param, max_slots=3, max_len=40)
    return m, m.forward_full(SEQ[None])


def test_the_state_cache_per_mamba_layer_and_slot(run):
    m, _ = run
    assert m.state_kind == "Mamba-2"
    assert tuple(m.mamba_conv.shape) == (2, 3, 4 * 8 + 2 * 2 * 8, 3) and m.mamba_conv.dtype == torch.float32
    assert tuple(m.ssm_state.shape) == (2, 3, 4, 8, 8) and m.ssm_state.dtype == torch.float32


def test_prefill_decode_and_chunked_prefill_equal_the_full_forward(run):
    m, full = run
    for s in range(3):
        m.reset(s)
    assert err(m.prefill(SEQ[:20], 0), full[19]) < TOL                 # two chunks of 16, the second partial
    assert err(m.decode_step(SEQ[20:21], [0])[0], full[20]) < TOL
    m.reset(0)
    for start in range(0, 16, 4):                                        # after cached tokens: from the slot's state
        m.prefill(SEQ[start: start + 4], 0, logits=False)
    assert err(m.prefill(SEQ[16:20], 0), full[19]) < TOL


def test_slots_at_different_lengths_decode_together_and_a_whole_prefix_is_reused(run):
    m, full = run
    for s in range(3):
        m.reset(s)
    m.prefill(SEQ[:20], 0, logits=False)
    m.prefill(SEQ[:10], 1, logits=False)
    out = m.decode_step(torch.stack([SEQ[20], SEQ[10]]), [0, 1])
    assert err(out[0], full[20]) < TOL and err(out[1], full[10]) < TOL
    m.copy_prefix(1, 2, 11)                                              # all 11 of slot 1: its states copied
    assert err(m.decode_step(SEQ[11:12], [2])[0], full[11]) < TOL
    assert err(m.decode_step(SEQ[11:12], [1])[0], full[11]) < TOL       # the source runs on from its own state
    with pytest.raises(RooflineError) as e:
        m.copy_prefix(1, 2, 5)
    assert str(e.value) == ("cannot reuse a prefix of 5 tokens of slot 1 holding 12: its Mamba-2 layers keep their "
                            "state after all 12 tokens only; reuse all 12, or prefill from scratch.")


def test_the_two_backends_agree():
    a = LlamaModel(TOY, dtype="fp32", backend="torch", max_len=24).forward_full(SEQ[None])
    b = LlamaModel(TOY, dtype="fp32", backend="triton", max_len=24).forward_full(SEQ[None])
    assert err(b, a) < TOL


def test_the_dt_limit_clamps_the_prefill_scan():
    """mamba_dt_min 0.001 (Nemotron-H's time_step_min) bites nowhere on these weights; 5.0 clamps every step's dt
    and moves the logits."""
    from dataclasses import replace

    base = LlamaModel(TOY, dtype="fp32", backend="torch", max_len=24).forward_full(SEQ[None])
    same = LlamaModel(replace(TOY, mamba_dt_min=0.0), dtype="fp32", backend="torch", max_len=24).forward_full(SEQ[None])
    moved = LlamaModel(replace(TOY, mamba_dt_min=5.0), dtype="fp32", backend="torch",
                       max_len=24).forward_full(SEQ[None])
    assert err(same, base) < TOL and err(moved, base) > 1e-2
    with pytest.raises(RooflineError, match=r"mamba_dt_max \(0.5\) is below mamba_dt_min \(1.0\)"):
        replace(TOY, mamba_dt_min=1.0, mamba_dt_max=0.5)
