"""Gated DeltaNet hybrids (issue 32, Qwen3-Next / Qwen3.5 / Qwen3.5-MoE), costed: the formulas pinned by exact
integers, the layer as data (attention ops on the full-attention layers only, DeltaNet's on the others), the
state's bytes in the capacity estimate (constant in the context) and in a decode step's reads, the family
readers' parameter counts against transformers' on the meta device, prefill FLOPs against FlopCounterMode's
count of transformers' forward (after the stated conventions), the split explain prints, and the run paths'
one-line refusal."""

from __future__ import annotations

import pytest

from roofline import formulas as F
from roofline import workload as W
from roofline.capacity import kv_bytes, state_bytes
from roofline.errors import RooflineError
from roofline.layer import model_ops, model_params
from roofline.models import ModelConfig, load_model

# A 4-layer hybrid (3 DeltaNet layers, then full attention), Qwen3-Next's layout at toy sizes.
HYB = ModelConfig("toy-hybrid", 64, 96, 4, 4, 2, 256, 512, head_dim=16, arch="qwen3_next",
                  layer_types=("linear", "linear", "linear", "full"), linear_k_heads=2, linear_v_heads=4,
                  linear_k_dim=8, linear_v_dim=12, linear_conv=4, attn_gate=True, qk_norm=True, norm_offset=True,
                  rotary_dim=4)


# ---- formulas, by hand

def test_chunked_prefill_flops_and_bytes_by_hand():
    # 2 sequences x 100 tokens: 2 chunks of 64 each (the last padded), 4 value heads, dk 8, dv 12
    mm = 4 * 64 * 64 * 8 + 2 * 64 * 64 * 12 + 6 * 64 * 8 * 12          # 266,240 per chunk and head
    solves = 64 * 63 * (8 + 12)                                          # 80,640
    assert F.delta_solve_flops(2, 4, 8, 12) == 2 * 4 * 80_640
    c = F.gated_delta_prefill(2, 100, 2, 4, 8, 12)
    assert c.flops == 2 * 2 * 4 * (mm + solves) == 5_550_080
    # per token: q, k (2 x 2 x 8), v and out (2 x 4 x 12), beta (4) in bf16, g (4) in fp32; the state written once
    assert c.bytes == 200 * ((32 + 96 + 4) * 2 + 4 * 4) + 2 * 4 * 8 * 12 * 4 == 59_072
    assert F.gated_delta_prefill(2, 100, 2, 4, 8, 12, reads_state=True).bytes == 59_072 + 3_072


def test_recurrent_decode_reads_and_writes_the_state_once():
    c = F.gated_delta_decode(2, 2, 4, 8, 12)
    assert c.flops == 2 * 4 * (7 * 8 * 12 + 2 * 12) == 5_568
    assert c.bytes == 2 * 280 + 2 * 2 * (4 * 8 * 12 * 4) == 6_704


def test_conv_gates_norm_and_output_gate_by_hand():
    conv = F.causal_conv1d(200, 2, 80, 4, reads_state=True)
    assert (conv.flops, conv.bytes) == (12 * 200 * 80, 2 * 16_000 * 2 + 80 * 4 * 2 + 2 * 2 * 80 * 3 * 2)
    assert (conv.flops, conv.bytes) == (192_000, 66_560)
    g = F.delta_gates(200, 4)
    assert (g.flops, g.bytes) == (5_600, 3 * 800 * 2 + 800 * 4 + 2 * 4 * 2) == (5_600, 8_016)
    n = F.gated_rmsnorm(800, 12)
    assert (n.flops, n.bytes) == (86_400, 57_624)
    s = F.sigmoid_gate(100, 64)
    assert (s.flops, s.bytes) == (25_600, 38_400)
    assert F.deltanet_state_bytes(2, 4, 8, 12, 4) == 4 * 8 * 12 * 4 + 80 * 3 * 2 == 2_016


# ---- the layer as data

def test_attention_ops_run_on_the_full_layers_and_deltanet_ops_on_the_others():
    ops = {o.name: o for o in model_ops(HYB)}
    assert HYB.attention_layers == (3,) and HYB.linear_layers == (0, 1, 2)
    for name in ("q_proj", "k_proj", "v_proj", "q_norm", "rope", "kv_append", "attention", "attn_output_gate",
                 "o_proj"):
        assert (ops[name].count, ops[name].layers) == (1, (3,)), name
    for name in ("in_proj_qkvz", "in_proj_ba", "conv1d", "delta_gates", "gated_delta", "gated_norm", "out_proj"):
        assert (ops[name].count, ops[name].layers) == (3, (0, 1, 2)), name
    assert ops["q_proj"].dims["out_features"] == 2 * 4 * 16          # q and its gate
    assert ops["in_proj_qkvz"].dims["out_features"] == 2 * 16 + 2 * 48
    assert ops["in_proj_ba"].dims["out_features"] == 8
    assert ops["conv1d"].dims == {"channels": 80, "kernel": 4}
    assert ops["attn_residual"].count == ops["mlp_norm"].count == 4


def test_parameters_by_hand():
    attn = 64 * 128 + 2 * 64 * 32 + 64 * 64 + 2 * 16                  # q (x2), k, v, o, q/k norms
    delta = 64 * 128 + 64 * 8 + 80 * 4 + 2 * 4 + 12 + 48 * 64   # in_proj_qkvz, _ba, conv, A_log + dt_bias, norm, out
    mlp = 3 * 64 * 96 + 2 * 64                                          # SwiGLU and the two norms
    assert model_params(HYB) == attn + 3 * delta + 4 * mlp + 2 * 256 * 64 + 64


def test_linear_layers_need_their_sizes():
    with pytest.raises(RooflineError, match="linear-attention layers need linear_k_heads"):
        ModelConfig("bad", 64, 96, 2, 4, 2, 256, 512, layer_types=("linear", "full"))
    with pytest.raises(RooflineError, match="layer_types names no \"linear\" layer"):
        ModelConfig("bad", 64, 96, 2, 4, 2, 256, 512, linear_conv=4)


def test_tensor_parallelism_is_refused_in_one_line():
    with pytest.raises(RooflineError, match="Gated DeltaNet layers are not modelled under tensor parallelism"):
        W.decode(HYB, 1, 16, tp=2)


# ---- state bytes: capacity and a decode step's reads

def test_state_is_counted_with_the_kv_cache_and_constant_in_context():
    per_layer = 4 * 8 * 12 * 4 + 80 * 3 * 2                             # 2,016
    assert state_bytes(HYB) == 3 * per_layer == 6_048
    for ctx in (16, 256):   # one attention layer of 2 KV heads x 16 dims, bf16, K and V
        assert kv_bytes(HYB, 2, ctx) == 2 * (2 * ctx * 2 * 16 * 2 + 6_048)
    ph = W.decode(HYB, 2, 256)
    assert ph.kv_cache_read_bytes == 2 * 2 * 256 * 2 * 16 * 2
    assert ph.state_read_bytes == 2 * 6_048 == W.decode(HYB, 2, 16).state_read_bytes
    assert W.prefill(HYB, 2, 64).state_read_bytes == 0


# ---- transformers: parameter counts on the meta device, FLOPs by FlopCounterMode

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from hf_counts import flop_split  # noqa: E402  (transformers' own counts)

TOY = dict(vocab_size=256, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
           head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
           linear_value_head_dim=12, max_position_embeddings=512)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48)


def _configs(small: bool) -> dict:
    """transformers' configs: toy sizes, or the classes' defaults (their docstrings: Qwen3-Next-80B-A3B, Qwen3.5-9B,
    Qwen3.5-35B-A3B style)."""
    if not small:
        return {"qwen3_next": transformers.Qwen3NextConfig(), "qwen3_5_text": transformers.Qwen3_5TextConfig(),
                "qwen3_5_moe": transformers.Qwen3_5MoeConfig()}
    return {"qwen3_next": transformers.Qwen3NextConfig(intermediate_size=96, **TOY, **MOE),
            "qwen3_next_dense": transformers.Qwen3NextConfig(intermediate_size=96, num_experts=0, **TOY),
            "qwen3_5_text": transformers.Qwen3_5TextConfig(intermediate_size=96, **TOY),
            "qwen3_5_moe": transformers.Qwen3_5MoeConfig(text_config=dict(**TOY, **MOE))}


@pytest.mark.parametrize("small", [True, False])
def test_parameter_counts_equal_transformers_on_the_meta_device(small, tmp_path):
    for name, c in _configs(small).items():
        c.save_pretrained(tmp_path / name)
        ours = model_params(load_model(str(tmp_path / name)))
        with torch.device("meta"):
            hf = transformers.AutoModelForCausalLM.from_config(c.get_text_config() if "moe" in name and
                                                               name.startswith("qwen3_5") else c)
        assert ours == sum(p.numel() for p in hf.parameters()), name


def test_the_published_defaults_read_as_the_hybrid_they_are(tmp_path):
    transformers.Qwen3NextConfig().save_pretrained(tmp_path)
    m = load_model(str(tmp_path))
    assert (len(m.attention_layers), len(m.linear_layers)) == (12, 36)
    assert (m.linear_k_heads, m.linear_v_heads, m.linear_k_dim, m.linear_v_dim, m.linear_conv) == (16, 32, 128, 128, 4)
    assert (m.attn_gate, m.qk_norm, m.norm_offset, m.rotary_dim, m.shared_gate) == (True, True, True, 64, True)
    # 36 layers x (32 x 128 x 128 x 4 recurrent + 8,192 channels x 3 x 2 conv), batch 1
    assert state_bytes(m) == 36 * (2_097_152 + 49_152) == 77_266_944


@pytest.mark.parametrize("name", ["qwen3_next_dense", "qwen3_5_text"])
@pytest.mark.parametrize("seq", [100, 128])
def test_prefill_flops_match_flopcountermode_after_the_conventions(name, seq, tmp_path):
    c = _configs(True)[name]
    c.save_pretrained(tmp_path)
    cfg = load_model(str(tmp_path))
    theirs = flop_split(c, seq)
    ph = W.prefill(cfg, 1, seq, act_dtype="fp32")
    kinds = {o.name: o.kind for o in model_ops(cfg)}
    ours = {k: sum(o.total.flops for o in ph.ops if kinds[o.name] == k)
            for k in ("linear", "conv1d", "gated_delta", "attention")}
    n_lin, K, ch = len(cfg.linear_layers), cfg.linear_conv, 80
    # the conventions: ours counts the conv's SiLU (4 per element) and the UT solves, which FlopCounterMode does not
    # (no formula for linalg.solve_triangular); torch's conv1d computes seq + K - 1 outputs and drops K - 1; eager
    # attention multiplies the whole seq x seq score matrix, ours the causal half
    conv = ours["conv1d"] - n_lin * 4 * seq * ch
    delta = ours["gated_delta"] - n_lin * F.delta_solve_flops(F.delta_chunks(seq), 4, 8, 12)
    assert conv == pytest.approx(theirs["conv"] * seq / (seq + K - 1), rel=1e-12)
    assert delta == theirs["scan"]
    assert ours["attention"] == pytest.approx(theirs["attention"] / 2, rel=0.02)
    assert ours["linear"] == pytest.approx(theirs["linear"], rel=0.02)


# ---- explain, and the run paths

def test_explain_prints_the_split_per_kind(tmp_path):
    from roofline.devices import find_device
    from roofline.explain import ExplainSpec, explain_step

    transformers.Qwen3NextConfig(max_position_embeddings=262144).save_pretrained(tmp_path)
    spec = ExplainSpec(load_model(str(tmp_path)), find_device("h100"), phase="decode", batch=1, context=131072)
    text = explain_step(spec).text()
    assert ("at context 131,072: 12 attention layers read 3.22 GB of KV, 36 DeltaNet layers read 77.3 MB of state"
            in text)


def test_the_run_paths_refuse_a_kind_without_kernels_in_one_line(monkeypatch):
    """Gated DeltaNet runs (kernels.deltanet): the model and the runners build; a layer kind registered in
    roofline.layer.NOT_RUN (formulas, no kernels) is refused before anything runs."""
    from kernels.model import LlamaModel
    from kernels.runners import make_runners
    from roofline import layer as LY

    assert "linear" not in LY.NOT_RUN
    assert {r.name for r in make_runners(HYB, "decode", 1, 8, dtype="fp32", backend="torch")} >= {
        "conv1d", "delta_gates", "gated_delta", "gated_norm", "attn_output_gate", "layer"}
    LlamaModel(HYB, dtype="fp32", backend="torch", max_len=16)
    monkeypatch.setitem(LY.NOT_RUN, "linear", "Gated DeltaNet")
    refusal = ("toy-hybrid: Gated DeltaNet layers are costed but not run yet: roofline explain and the cost commands "
               "take this model; profile, latency, serve and check do not.")
    with pytest.raises(RooflineError) as e:        # profile's runners (and roofline check's)
        make_runners(HYB, "decode", 1, 8, dtype="fp32", backend="torch")
    assert str(e.value) == refusal
    with pytest.raises(RooflineError) as e:        # latency's and serve's model
        LlamaModel(HYB, dtype="fp32", backend="torch")
    assert str(e.value) == refusal
