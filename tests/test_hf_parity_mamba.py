"""Logits parity with transformers for Mamba-2 hybrids (issue 32): tests/hf_tiny_mamba.py's tiny nemotron_h (blocks M,
E, *, -: a Mamba-2 mixer alone, relu2 experts + shared expert alone, attention without RoPE alone, a relu2 MLP alone),
granitemoehybrid (Mamba-2, attention, Mamba-2 mixers, each with SwiGLU experts beside the shared MLP, Granite's
multipliers, a dt clamp that bites), its variant without experts (the shared MLP alone, attention without RoPE), and
falcon_h1 (attention and Mamba-2 side by side in every layer, every muP multiplier away from 1; y x silu(z), or the
gated RMSNorm in its norm-then-gate order with a dt clamp) run through our model on their real weights: prefill,
decode, chunked prefill (chunks of 4 and 7 across the scan's chunk of 16), two slots of different lengths decoded
together, prefix reuse of a whole cached sequence (the state cache keeps each slot's state at its end) and the
one-line refusal of a shorter prefix; every logit row within 1e-4 of transformers' largest logit on the same path (a
cached prefill then decode steps: ``decode`` rows; one forward: ``prefill`` rows), on both backends (Triton
interpreted: fewer steps). ``roofline profile --quick`` on the tiny checkpoints records each op at the formulas'
cost; the serving engine runs them without a prefix cache and refuses one in one line."""

from __future__ import annotations

import pytest
import torch

import hf_tiny_mamba as H
from kernels.model import LlamaModel
from parity import close, model, prefill_then_decode
from roofline.errors import RooflineError
from roofline.models import load_model


def built(model_type, **kw):
    H.require(model_type)
    return H.checkpoint(model_type), H.reference(model_type, **kw)


def cached(folder, ref, k):
    """transformers' rows for ``ref.sequence`` after a cached prefill of its first ``k`` tokens, one token a step."""
    return H.reference_logits(folder, ref.sequence, prompt=k).decode


@pytest.mark.parametrize("model_type", H.MODEL_TYPES)
def test_the_reader_finds_the_layers(model_type):
    cfg, want = load_model(H.checkpoint(model_type)), H.LAYERS[model_type]
    assert (cfg.mamba_layers, cfg.attention_layers, cfg.moe_layers, cfg.no_mlp_layers) == \
        (want["mamba"], want["attention"], want["moe"], want["no_mlp"])
    assert (cfg.mamba_heads, cfg.mamba_head_dim, cfg.mamba_state, cfg.mamba_groups, cfg.mamba_conv, cfg.mamba_chunk,
            cfg.mamba_conv_bias, cfg.mamba_proj_bias) == (4, want["head_dim"], 8, 2, 4, 16, True, True)
    assert (cfg.mamba_dt_min, cfg.mamba_dt_max) == {"nemotron_h": (0.001, 0.0), "granitemoehybrid": (0.2, 1.5),
                                                    "granitemoehybrid_dense": (0.0, 0.0), "falcon_h1": (0.0, 0.0),
                                                    "falcon_h1_norm": (0.2, 1.5)}[model_type]
    if model_type == "nemotron_h":
        assert (cfg.activation, cfg.expert_activation, cfg.rms_eps, cfg.nope_layers) == ("relu2", "relu2", 1e-5, (2,))
    elif model_type.startswith("falcon_h1"):
        norm = model_type == "falcon_h1_norm"
        assert cfg.layer_types == ("hybrid", "hybrid") and (cfg.mamba_norm, cfg.mamba_norm_first) == (norm, norm)
        assert (cfg.embed_multiplier, cfg.logits_scaling, cfg.qkv_bias, cfg.o_bias) == (2.0, 2.0, True, True)
        assert dict(cfg.layer_scales) == {
            "ssm_in_multiplier": 1.2, "ssm_out_multiplier": 0.9, "attention_in_multiplier": 1.3, "key_multiplier": 0.7,
            "attention_out_multiplier": 0.8, "mlp_multipliers": (1.4, 0.6),
            "ssm_multipliers": (1.1, 0.9, 1.2, 0.8, 1.3)}
    else:
        assert (cfg.embed_multiplier, cfg.residual_multiplier, cfg.query_scale, cfg.logits_scaling) == \
            (12.0, 0.22, 0.1, 2.5)
        assert cfg.nope_layers == (() if model_type == "granitemoehybrid" else (0,))


@pytest.mark.parametrize("model_type", H.MODEL_TYPES)
def test_prefill_then_decode(model_type):
    prefill_then_decode(*built(model_type))


@pytest.mark.parametrize("model_type", H.MODEL_TYPES)
def test_chunked_prefill_and_slots_of_different_lengths(model_type):
    folder, ref = built(model_type)
    seq = torch.tensor(ref.sequence)
    n = len(seq)
    m = model(folder, n)
    for start in range(0, n - 4, 4):                       # 16 = the scan's chunk: the later calls start from a state
        m.prefill(seq[start: start + 4], 0, logits=False)
    close(m.prefill(seq[start + 4:], 0), ref.prefill[n - 1])
    m.reset(0)
    m.prefill(seq[:7], 0, logits=False)
    close(m.prefill(seq[7:n - 1], 0), ref.prefill[n - 2])     # 12 tokens from position 7: across position 16
    m.prefill(seq[: ref.prompt], 1, logits=False)
    out = m.decode_step(torch.stack([seq[n - 1], seq[ref.prompt]]), [0, 1])   # lengths 19 and 5 in one step
    close(out[0], cached(folder, ref, n - 1)[n - 1])          # transformers: a cached prefill of 19, then a step
    close(out[1], ref.decode[ref.prompt])


@pytest.mark.parametrize("model_type", H.MODEL_TYPES)
def test_prefix_reuse_of_a_whole_sequence(model_type):
    folder, ref = built(model_type)
    seq = torch.tensor(ref.sequence)
    n = len(seq)
    m = model(folder, n)
    m.prefill(seq[: n - 6], 0, logits=False)              # the source holds exactly the prefix: its state is kept
    close(m.prefill_with_prefix(seq, 1, 0, n - 6), ref.prefill[n - 1])
    close(m.decode_step(seq[n - 6: n - 5], [0])[0], cached(folder, ref, n - 6)[n - 6])
    with pytest.raises(RooflineError) as e:
        m.prefill_with_prefix(seq, 2, 0, n - 8)
    assert str(e.value) == (f"cannot reuse a prefix of {n - 8} tokens of slot 0 holding {n - 5}: its Mamba-2 layers "
                            f"keep their state after all {n - 5} tokens only; reuse all {n - 5}, or prefill from "
                            "scratch.")


@pytest.mark.parametrize("model_type", H.MODEL_TYPES)
def test_triton_kernels_on_real_weights(model_type):
    """The Mamba-2 kernels (the SSD scan from zeros and from a state, the recurrent step, the conv with its bias and
    state, the gated group norm), relu2 and the ungated fused experts (Nemotron-H) interpreted here, with prefix
    reuse of the whole source."""
    folder, ref = built(model_type)
    seq = torch.tensor(ref.sequence)
    m = model(folder, len(seq), "triton")
    m.prefill(seq[:5], 0, logits=False)
    close(m.prefill(seq[5:18], 0), ref.prefill[17])        # from a state, across position 16
    close(m.decode_step(seq[18:19], [0])[0], cached(folder, ref, 18)[18])
    m.reset(0)
    close(m.prefill(seq[:5], 0), ref.decode[4])
    close(m.decode_step(seq[5:6], [0])[0], ref.decode[5])
    close(m.prefill_with_prefix(seq[:9], 1, 0, 6), ref.prefill[8])


@pytest.mark.parametrize("model_type,backend", [("nemotron_h", "torch"), ("nemotron_h", "triton"),
                                                ("falcon_h1", "torch")])
def test_profile_records_the_formulas_costs(model_type, backend, tmp_path, monkeypatch):
    """`roofline profile --quick` on the tiny checkpoint: a point per op of both phases (Triton interpreted too),
    each recorded with the workload's cost of that op (the SSD scan's from roofline.formulas.mamba, by hand here
    too); "layer" times layer 0 alone (a Mamba-2 mixer; Falcon-H1's with its attention) at its own ops' cost."""
    from click.testing import CliRunner

    from profiler import ceilings as C
    from profiler import kernel_checks as R
    from profiler.cli import main
    from roofline import formulas as F
    from roofline import workload as W
    from roofline.cost import Cost
    from roofline.devices import cpu_device
    from roofline.layer import model_ops
    from roofline.records import read_results

    monkeypatch.setattr(R, "validate_kernels", lambda backends, dtype, device="cpu": [])
    monkeypatch.setattr(C, "get_ceilings", lambda device="cpu", **kw: C.Ceilings(
        cpu_device(C.device_name("cpu"), {"fp32": 1e11, "bf16": 5e10}, 2e10), None,
        {"bandwidth": {}, "gemm": {}, "label": "achievable"}))
    folder, out = H.checkpoint(model_type), tmp_path / "out"
    r = CliRunner().invoke(main, ["profile", "--device", "cpu", "--model", str(folder), "--phases", "prefill,decode",
                                  "--batches", "2", "--contexts", "9", "--backends", backend, "--dtype", "fp32",
                                  "--budget-ms", "1", "--quick", "--out", str(out), "--no-report", "--quiet"])
    assert r.exit_code == 0, r.output
    rf = read_results(out / "results.jsonl")
    cfg = load_model(folder)
    got = {(m.point.phase, m.point.op): m.point.cost for m in rf.measurements}
    names = [o.name for o in model_ops(cfg)]
    for phase, make in (("prefill", W.prefill), ("decode", W.decode)):
        ph = make(cfg, 2, 9, act_dtype="fp32", weight_dtype="fp32", kv_dtype="fp32")
        assert {op for p, op in got if p == phase} == set(names) | {"layer"}
        for op in names:
            assert got[(phase, op)] == ph.op(op).cost, (phase, op)
        own = [ph.op(o.name).cost for o in model_ops(cfg) if o.per_layer and 0 in o.layers]     # layer 0's ops
        assert got[(phase, "layer")] == sum(own, Cost(0, 0))
    assert got[("decode", "ssd_scan")] == F.ssd_decode(2, 4, 8, 8, 2, act_dtype="fp32")
    assert got[("prefill", "ssd_scan")] == F.ssd_prefill(2, 9, 4, 8, 8, 2, chunk=16, act_dtype="fp32")
    assert got[("decode", "conv1d")] == F.causal_conv1d(2, 2, 32 + 2 * 2 * 8, 4, act_dtype="fp32", reads_state=True,
                                                          bias=True)


def test_serving_runs_without_a_prefix_cache_and_refuses_one():
    """The continuous-batching engine (latency, serve) on Nemotron-H: two overlapping requests (decoded in one batch,
    prefilled in chunks of 6 beside it) generate what each generates alone; a prefix cache (part of a prompt reused)
    is off by default for it, and asking for one is refused in one line before anything runs."""
    from profiler.serving import RequestSpec, serve

    folder = H.checkpoint("nemotron_h")
    m = LlamaModel(load_model(folder), dtype="fp32", backend="torch", max_slots=2, max_len=40)
    specs = [RequestSpec(0, 0.0, "a state space model", 6), RequestSpec(1, 0.0, "keeps its state", 6)]
    together = serve(m, specs, prefix_cache=False, chunk_budget=6)
    assert max(st["decode"] for st in together.steps) == 2
    for spec in specs:
        assert together.texts[spec.id] == serve(m, [spec]).texts[spec.id]     # the default: no prefix cache
    with pytest.raises(RooflineError) as e:
        serve(m, specs, prefix_cache=True)
    assert str(e.value) == (f"{m.cfg.name}: its Mamba-2 layers keep their state after a slot's last token only, so a "
                            "prefix cache cannot reuse part of a prompt: leave out --prefix-cache (the default is off "
                            "for this model) or pass --no-prefix-cache.")
