"""The Llama-style model: cache invariants per dtype, backends, and its user-facing errors.

Run: pytest tests/test_kernels_model.py
"""

import pytest
import torch

import kernels  # noqa: F401
from kernels.check import MODEL_TOL, run_checks
from kernels.model import LlamaModel
from roofline.errors import RooflineError
from roofline.models import load_model

TINY = load_model("tiny")


# fp32 and bf16 (the GPU default): fp16 takes the same 16-bit storage path through the interpreter as bf16,
# and tests/test_kernels_ops.py checks every kernel in fp16 too.
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_model_invariants(dtype):
    res = {r.name: r for r in run_checks("triton", dtype, parts=("model",))}
    assert set(res) == {"model prefill+decode = forward_full", "model chunked prefill = unchunked",
                        "model prefix reuse = full prefill", "model triton = torch backend"}
    for r in res.values():
        assert r.tol == MODEL_TOL[dtype]
        assert r.max_rel_err <= r.tol, str(r)
    if dtype == "fp32":
        # fp32: the cached paths reorder no sums at these sizes; torch differs by rounding only
        assert res["model triton = torch backend"].max_rel_err < 1e-5


@pytest.fixture(scope="module")
def model():
    return LlamaModel(TINY, dtype="fp32", backend="torch", max_slots=3, max_len=16)


def test_lengths_and_greedy(model):
    for s in range(3):
        model.reset(s)
    logits = model.prefill(torch.tensor([1, 2, 3, 4]), 0)
    assert logits.shape == (TINY.vocab,) and logits.dtype == torch.float32
    model.prefill(torch.tensor([5, 6]), 1)
    out = model.decode_step(torch.tensor([7, 8]), torch.tensor([0, 1]))
    assert out.shape == (2, TINY.vocab)
    assert model.lengths.tolist() == [5, 3, 0]
    assert LlamaModel.greedy(torch.tensor([[0.1, 3.0, -1.0], [5.0, 0.0, 0.0]])).tolist() == [1, 0]
    model.copy_prefix(0, 2, 3)
    assert model.lengths.tolist() == [5, 3, 3]
    assert torch.equal(model.k_cache[:, 2, :, :3], model.k_cache[:, 0, :, :3])


def test_greedy_generation_same_on_both_backends():
    toks = torch.tensor([3, 14, 15, 92, 65])
    gen = {}
    for be in ("triton", "torch"):
        m = LlamaModel(TINY, dtype="fp32", backend=be, max_slots=1, max_len=16, seed=3)
        t = m.greedy(m.prefill(toks, 0))
        seq = [int(t)]
        for _ in range(3):
            t = m.greedy(m.decode_step(t.view(1), torch.tensor([0])))[0]
            seq.append(int(t))
        gen[be] = seq
    assert gen["triton"] == gen["torch"]


def test_errors(model):
    for s in range(3):
        model.reset(s)
    with pytest.raises(RooflineError, match="chunk of zero tokens"):
        model.prefill(torch.tensor([], dtype=torch.long), 0)
    with pytest.raises(RooflineError, match="past the KV cache capacity of 16"):
        model.prefill(torch.arange(17), 0)
    model.prefill(torch.arange(16), 0)
    with pytest.raises(RooflineError, match="past the KV cache capacity of 16"):
        model.decode_step(torch.tensor([1]), torch.tensor([0]))
    with pytest.raises(RooflineError, match="cannot reuse a prefix of 17 tokens: slot 0 holds 16"):
        model.copy_prefix(0, 1, 17)
    with pytest.raises(RooflineError, match=r"reused prefix \(4\) must be shorter than the prompt \(4\)"):
        model.prefill_with_prefix(torch.arange(4), 1, 0, 4)
    with pytest.raises(RooflineError, match="slot 3 does not exist"):
        model.prefill(torch.arange(2), 3)
    with pytest.raises(RooflineError, match="a slot twice"):
        model.decode_step(torch.tensor([1, 2]), torch.tensor([1, 1]))
    with pytest.raises(RooflineError, match="token ids in 0..255"):
        model.prefill(torch.tensor([256]), 1)
    with pytest.raises(ValueError, match=r"tokens must have shape \[1, S\]"):
        model.forward_full(torch.arange(3))
    assert model.lengths.tolist() == [16, 0, 0]   # failed calls changed nothing


def test_bad_backend_and_dtype():
    with pytest.raises(RooflineError, match="Unknown backend 'cuda'"):
        LlamaModel(TINY, backend="cuda")
    with pytest.raises(ValueError, match="dtype 'int8' is not supported"):
        LlamaModel(TINY, dtype="int8")


def test_model_check_catches_a_decode_that_misses_the_new_key(monkeypatch):
    # A decode attention that forgets the token just appended (lengths - 1) must fail the check.
    from kernels.backend import get_ops

    ops = get_ops("torch")
    good = ops.decode_attention
    monkeypatch.setattr(ops, "decode_attention",
                        lambda q, kc, vc, lens, slots, max_len=None: good(q, kc, vc, lens - 1, slots, max_len=max_len))
    res = {r.name: r for r in run_checks("torch", "fp32", parts=("model",))}
    assert not res["model prefill+decode = forward_full"].passed
    assert res["model prefill+decode = forward_full"].max_rel_err > 1e-2
    assert res["model chunked prefill = unchunked"].passed


def test_non_final_chunks_skip_the_lm_head():
    m = LlamaModel(TINY, dtype="fp32", backend="torch", seed=3, max_slots=2, max_len=32)
    ids = torch.arange(1, 12) % TINY.vocab
    whole = m.prefill(ids, 0)
    assert m.prefill(ids[:7], 1, logits=False) is None   # no prediction for a non-final chunk
    last = m.prefill(ids[7:], 1)
    assert int(m.lengths[1]) == 11
    torch.testing.assert_close(last, whole, rtol=1e-5, atol=1e-5)
