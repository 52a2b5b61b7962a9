"""Logits parity with transformers for Gated DeltaNet hybrids (issue 32): tests/hf_tiny_moe.py's tiny qwen3_next
(DeltaNet on layers 0, 1, 3, gated attention with partial RoPE on layer 2, routed experts with a sigmoid-gated
shared expert, one dense layer) and qwen3_5_text (the same layers with Qwen3.5's four DeltaNet projections, dense
MLPs) run through our model on its real weights: prefill, decode, chunked prefill,
prefix reuse of a whole cached sequence (the state cache keeps each slot's state at its end) and the one-line
refusal of a shorter prefix; every logit row within 1e-4 of transformers' largest logit, on both backends (Triton
interpreted: fewer steps), and a prompt past one chunk of 64 (the chunked rule's chunk boundary)."""

from __future__ import annotations

import pytest
import torch

import hf_tiny_moe as H
from kernels.model import LlamaModel
from parity import close, model, prefill_then_decode
from roofline.errors import RooflineError
from roofline.models import load_model


def built(model_type):
    H.require(model_type)
    return H.checkpoint(model_type), H.reference(model_type)


@pytest.mark.parametrize("model_type", H.HYBRID)
def test_the_reader_finds_the_hybrid(model_type):
    cfg = load_model(H.checkpoint(model_type))
    assert cfg.linear_layers == (0, 1, 3) and cfg.attention_layers == (2,) and cfg.attn_gate
    assert (cfg.linear_k_heads, cfg.linear_v_heads, cfg.linear_k_dim, cfg.linear_v_dim, cfg.linear_conv) == \
        (2, 4, 16, 24, 4)
    assert cfg.moe_layers == H.MOE_LAYERS[model_type] and cfg.shared_gate == bool(cfg.moe_layers)
    assert cfg.rotary_dim == 8 and cfg.norm_offset and cfg.qk_norm


@pytest.mark.parametrize("model_type", H.HYBRID)
def test_prefill_then_decode(model_type):
    prefill_then_decode(*built(model_type))


@pytest.mark.parametrize("model_type", H.HYBRID)
def test_chunked_prefill_and_prefix_reuse(model_type):
    folder, ref = built(model_type)
    seq = torch.tensor(ref.sequence)
    n = len(seq)
    m = model(folder, n)
    for start in range(0, n - 4, 4):
        m.prefill(seq[start: start + 4], 0, logits=False)
    close(m.prefill(seq[start + 4:], 0), ref.prefill[n - 1])
    m.reset(0)
    m.prefill(seq[: n - 6], 0, logits=False)              # the source holds exactly the prefix: its state is kept
    close(m.prefill_with_prefix(seq, 1, 0, n - 6), ref.prefill[n - 1])
    close(m.decode_step(seq[n - 6: n - 5], [0])[0], ref.prefill[n - 6])    # the source runs on from its own state
    with pytest.raises(RooflineError) as e:
        m.prefill_with_prefix(seq, 2, 0, n - 8)
    assert str(e.value) == (f"cannot reuse a prefix of {n - 8} tokens of slot 0 holding {n - 5}: its Gated DeltaNet "
                            f"layers keep their state after all {n - 5} tokens only; reuse all {n - 5}, or prefill "
                            "from scratch.")


@pytest.mark.parametrize("model_type", H.HYBRID)
def test_a_prompt_past_one_chunk(model_type):
    """80 tokens: two chunks of 64 (the second partial), then a chunk after the cached 80 and a decode step."""
    folder = H.checkpoint(model_type)
    toks = H.tokens(84, 1)
    theirs = H.prefill_logits(folder, toks)
    m = model(folder, 84)
    close(m.forward_full(torch.tensor([toks])), theirs)
    m.prefill(torch.tensor(toks[:80]), 0, logits=False)
    close(m.prefill(torch.tensor(toks[80:83]), 0), theirs[82])
    close(m.decode_step(torch.tensor(toks[83:84]), [0])[0], theirs[83])


@pytest.mark.parametrize("model_type", H.HYBRID)
def test_triton_kernels_on_real_weights(model_type):
    """The DeltaNet kernels (chunked rule from zeros and from a state, the recurrent step, the conv with its
    state, the gates, the gated norm, the output gate) interpreted here, with prefix reuse of the whole source."""
    folder, ref = built(model_type)
    seq = torch.tensor(ref.sequence)
    m = model(folder, len(seq), "triton")
    m.prefill(seq[:5], 0, logits=False)
    close(m.prefill(seq[5:10], 0), ref.decode[9])
    close(m.decode_step(seq[10:11], [0])[0], ref.decode[10])
    close(m.prefill_with_prefix(seq[:13], 1, 0, 11), ref.prefill[12])


@pytest.mark.parametrize("model_type", H.HYBRID)
def test_profile_records_the_formulas_costs(model_type, tmp_path, monkeypatch):
    """`roofline profile` on the tiny checkpoint, torch backend: a point per op of both phases, each recorded with
    the workload's cost of that op (the DeltaNet ops' from roofline.formulas.deltanet, by hand here too)."""
    from click.testing import CliRunner

    from profiler import ceilings as C
    from profiler import kernel_checks as R
    from profiler.cli import main
    from roofline import formulas as F
    from roofline import workload as W
    from roofline.devices import cpu_device
    from roofline.records import read_results

    monkeypatch.setattr(R, "validate_kernels", lambda backends, dtype, device="cpu": [])
    monkeypatch.setattr(C, "get_ceilings", lambda device="cpu", **kw: C.Ceilings(
        cpu_device(C.device_name("cpu"), {"fp32": 1e11, "bf16": 5e10}, 2e10), None,
        {"bandwidth": {}, "gemm": {}, "label": "achievable"}))
    folder, out = H.checkpoint(model_type), tmp_path / "out"
    r = CliRunner().invoke(main, ["profile", "--device", "cpu", "--model", str(folder), "--phases", "prefill,decode",
                                  "--batches", "2", "--contexts", "9", "--backends", "torch", "--dtype", "fp32",
                                  "--budget-ms", "1", "--quick", "--out", str(out), "--no-report", "--quiet"])
    assert r.exit_code == 0, r.output
    rf = read_results(out / "results.jsonl")
    cfg = load_model(folder)
    got = {(m.point.phase, m.point.op): m.point.cost for m in rf.measurements}
    for phase, make in (("prefill", W.prefill), ("decode", W.decode)):
        ph = make(cfg, 2, 9, act_dtype="fp32", weight_dtype="fp32", kv_dtype="fp32")
        proj = "in_proj_qkvz" if model_type == "qwen3_next" else "in_proj_qkv"
        for op in ("conv1d", "delta_gates", "gated_delta", "gated_norm", "attn_output_gate", proj, "out_proj"):
            assert got[(phase, op)] == ph.op(op).cost, (phase, op)
    dec = F.gated_delta_decode(2, 2, 4, 16, 24, act_dtype="fp32")
    assert got[("decode", "gated_delta")] == dec and dec.flops == 2 * 4 * (7 * 16 * 24 + 2 * 24)
    assert got[("prefill", "gated_delta")] == F.gated_delta_prefill(2, 9, 2, 4, 16, 24, act_dtype="fp32")
    assert got[("decode", "conv1d")] == F.causal_conv1d(2, 2, 2 * 2 * 16 + 4 * 24, 4, act_dtype="fp32",
                                                          reads_state=True)


@pytest.mark.parametrize("model_type", H.HYBRID[:1])
def test_serving_runs_without_a_prefix_cache_and_refuses_one(model_type):
    """The continuous-batching engine (latency, serve) on the hybrid: two overlapping requests (decoded in one batch,
    prefilled in chunks of 4 beside it) generate what each generates alone; by default the prefix cache is off for
    it (the engine's default is the model's), and asking for one (part of a prompt reused) is refused in one line
    before anything runs."""
    from profiler.serving import RequestSpec, prefix_cache_for, serve

    folder = H.checkpoint(model_type)
    m = LlamaModel(load_model(folder), dtype="fp32", backend="torch", max_slots=2, max_len=40)
    specs = [RequestSpec(0, 0.0, "a hybrid model", 6), RequestSpec(1, 0.0, "keeps its state", 6)]
    together = serve(m, specs, prefix_cache=False, chunk_budget=6)
    assert max(st["decode"] for st in together.steps) == 2
    for spec in specs:
        assert together.texts[spec.id] == serve(m, [spec]).texts[spec.id]     # the default: no prefix cache
    assert prefix_cache_for(m.cfg, None) is False and prefix_cache_for(m.cfg, False) is False
    with pytest.raises(RooflineError) as e:
        serve(m, specs, prefix_cache=True)
    assert str(e.value) == (f"{m.cfg.name}: its Gated DeltaNet layers keep their state after a slot's last token "
                            "only, so a prefix cache cannot reuse part of a prompt: leave out --prefix-cache (the "
                            "default is off for this model) or pass --no-prefix-cache.")


def test_latency_on_the_hybrid_runs_with_the_prefix_cache_off_by_default(tmp_path):
    """`roofline latency --model <hybrid>` with no prefix-cache flag runs (the default is off for a model with state
    layers, and the header says so); `--prefix-cache` is refused in one line before anything runs; a dense model's
    default stays on."""
    import json

    from click.testing import CliRunner

    from profiler.cli import main
    from profiler.serving import prefix_cache_for
    from roofline.models import PRESETS

    folder, out = H.checkpoint(H.HYBRID[0]), tmp_path / "out"
    args = ["latency", "--model", str(folder), "--device", "cpu", "--backend", "torch", "--requests", "2",
            "--prompt-tokens", "6", "--output-tokens", "3", "--rate", "100", "--chunk", "4", "--max-slots", "2",
            "--out", str(out)]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in (out / "latency.jsonl").read_text().splitlines()]
    summaries = [row for row in rows if row.get("type") == "latency-summary"]
    assert [s["settings"]["prefix_cache"] for s in summaries] == [False]
    r = CliRunner().invoke(main, args + ["--prefix-cache", "--overwrite"])
    assert r.exit_code != 0 and "leave out --prefix-cache (the default is off for this model)" in r.output
    assert "Traceback" not in r.output
    assert prefix_cache_for(PRESETS["llama-3-8b"], None) is True
