"""Mamba-2 hybrids (issue 32, Nemotron-H), costed: the SSD scan's formulas pinned by exact integers, the layer as
data (each Nemotron-H block a layer with its mixer or its MLP), the SSM and conv state's bytes in the capacity
estimate (constant in the context) and in a decode step's reads, the reader's parameter counts against
transformers' on the meta device, prefill FLOPs against FlopCounterMode's count of transformers' torch path
(after the stated conventions), the split explain prints, and that the model runs every block kind (logits against
transformers': tests/test_hf_parity_mamba.py)."""

from __future__ import annotations

import pytest

from roofline import formulas as F
from roofline import workload as W
from roofline.capacity import kv_bytes, layer_states, state_bytes
from roofline.errors import RooflineError
from roofline.layer import model_ops, model_params
from roofline.models import ModelConfig, load_model

# Nemotron-H's blocks "M-M*-M" at toy sizes: Mamba-2 on 0, 2, 5; attention (no RoPE) on 3; relu2 MLPs on 1, 4
HYB = ModelConfig("toy-mamba", 64, 96, 6, 4, 2, 256, 512, head_dim=16, arch="nemotron_h", activation="relu2",
                  layer_types=("mamba", "mlp", "mamba", "full", "mlp", "mamba"), nope_layers=(3,),
                  no_mlp_layers=(0, 2, 3, 5), mamba_heads=4, mamba_head_dim=8, mamba_state=16, mamba_groups=2,
                  mamba_conv=4, mamba_chunk=32, mamba_conv_bias=True)


# ---- formulas, by hand

def test_ssd_chunked_prefill_flops_and_bytes_by_hand():
    # 2 sequences x 100 tokens: 4 chunks of 32 (the last padded), 4 heads of 8 channels, d_state 16, 2 groups
    per_chunk_head = 2 * 32 * 32 * (16 + 8) + 4 * 32 * 8 * 16 + 2 * 8 * 16       # 65,792
    assert F.ssd_prefill_flops(4, 4, 8, 16, 32) == 4 * 4 * per_chunk_head == 1_052_672
    c = F.ssd_prefill(2, 100, 4, 8, 16, 2, chunk=32)
    assert c.flops == 2 * 1_052_672 == 2_105_344
    # per token: x and y (2 x 32), B and C (2 x 2 x 16), dt (4) in bf16; A_log, dt_bias, D; the state written once
    assert c.bytes == 200 * 132 * 2 + 3 * 4 * 2 + 2 * 4 * 8 * 16 * 4 == 56_920
    assert F.ssd_prefill(2, 100, 4, 8, 16, 2, chunk=32, reads_state=True).bytes == 56_920 + 4_096


def test_ssd_decode_reads_and_writes_the_state_once():
    c = F.ssd_decode(2, 4, 8, 16, 2)
    assert c.flops == 2 * 4 * (5 * 8 * 16 + 2 * 8) == 5_248
    assert c.bytes == 2 * 132 * 2 + 24 + 2 * 2 * (4 * 8 * 16 * 4) == 8_744


def test_conv_with_its_bias_relu2_and_the_state_by_hand():
    conv = F.causal_conv1d(200, 2, 96, 4, bias=True)     # x, B, C: 32 + 2 x 2 x 16 channels
    assert (conv.flops, conv.bytes) == (13 * 200 * 96, 2 * 19_200 * 2 + 96 * 5 * 2 + 2 * 96 * 3 * 2)
    assert (conv.flops, conv.bytes) == (249_600, 78_912)
    assert F.causal_conv1d(200, 2, 96, 4).flops == 12 * 200 * 96      # DeltaNet's, without a bias, unchanged
    r = F.relu2(100, 96)
    assert (r.flops, r.bytes) == (19_200, 38_400)
    assert F.mamba_state_bytes(4, 8, 16, 2, 4) == 4 * 8 * 16 * 4 + 96 * 3 * 2 == 2_624


# ---- the layer as data

def test_each_block_runs_its_mixer_or_its_mlp():
    ops = {o.name: o for o in model_ops(HYB)}
    assert HYB.mamba_layers == (0, 2, 5) and HYB.attention_layers == (3,) and HYB.mlp_layers == (1, 4)
    for name in ("in_proj", "conv1d", "ssd_scan", "gated_norm", "out_proj"):
        assert (ops[name].count, ops[name].layers) == (3, (0, 2, 5)), name
    for name in ("q_proj", "k_proj", "v_proj", "kv_append", "attention", "o_proj"):
        assert (ops[name].count, ops[name].layers) == (1, (3,)), name
    assert "rope" not in ops and "gate_proj" not in ops          # no RoPE; up -> relu2 -> down
    for name in ("mlp_norm", "up_proj", "relu2", "down_proj", "mlp_residual"):
        assert (ops[name].count, ops[name].layers) == (2, (1, 4)), name
    assert (ops["attn_norm"].layers, ops["attn_residual"].layers) == ((0, 2, 3, 5),) * 2
    assert ops["in_proj"].dims["out_features"] == 32 + 96 + 4      # z, x B C, dt
    assert ops["conv1d"].dims == {"channels": 96, "kernel": 4, "bias": True}
    assert ops["gated_norm"].dims == {"width": 32, "rows": 1, "groups": 2}


def test_parameters_by_hand():
    mamba = 64 * 132 + 96 * 4 + 96 + 3 * 4 + 32 + 32 * 64 + 64      # in_proj, conv (+ bias), A_log dt_bias D, norm,
    attn = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 64                       # out_proj, the block's norm; q, k, v, o
    mlp = 2 * 64 * 96 + 64                                            # up, down
    assert model_params(HYB) == 3 * mamba + attn + 2 * mlp + 2 * 256 * 64 + 64 == 103_140


def test_mamba_layers_need_their_sizes_and_blocks_keep_a_mixer_or_an_mlp():
    with pytest.raises(RooflineError, match="Mamba-2 layers need mamba_heads"):
        ModelConfig("bad", 64, 96, 2, 4, 2, 256, 512, layer_types=("mamba", "full"))
    with pytest.raises(RooflineError, match="layer_types names no \"mamba\" layer"):
        ModelConfig("bad", 64, 96, 2, 4, 2, 256, 512, mamba_conv=4)
    with pytest.raises(RooflineError, match="no_mlp_layers must list layer indices"):
        ModelConfig("bad", 64, 96, 2, 4, 2, 256, 512, layer_types=("mlp", "full"), no_mlp_layers=(0,))


def test_tensor_parallelism_is_refused_in_one_line():
    with pytest.raises(RooflineError, match="Mamba-2 layers are not modelled under tensor parallelism"):
        W.decode(HYB, 1, 16, tp=2)


# ---- state bytes: capacity and a decode step's reads

def test_state_is_counted_with_the_kv_cache_and_constant_in_context():
    assert layer_states(HYB) == (("Mamba-2", 3, 3 * 2_624),)
    assert state_bytes(HYB) == 7_872
    for ctx in (16, 256):   # one attention layer of 2 KV heads x 16 dims, bf16, K and V
        assert kv_bytes(HYB, 2, ctx) == 2 * (2 * ctx * 2 * 16 * 2 + 7_872)
    ph = W.decode(HYB, 2, 256)
    assert ph.kv_cache_read_bytes == 2 * 2 * 256 * 2 * 16 * 2
    assert ph.state_read_bytes == 2 * 7_872 == W.decode(HYB, 2, 16).state_read_bytes
    assert W.prefill(HYB, 2, 64).state_read_bytes == 0
    scan = next(o for o in W.decode(HYB, 2, 256).ops if o.name == "ssd_scan")
    assert scan.total.flops == 3 * 5_248


# ---- transformers: parameter counts on the meta device, FLOPs by FlopCounterMode

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from hf_counts import flop_split, stored_params  # noqa: E402  (transformers' own counts)

TOY = dict(vocab_size=256, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
           intermediate_size=96, mamba_num_heads=4, mamba_head_dim=8, ssm_state_size=16, n_groups=2, conv_kernel=4,
           chunk_size=32, max_position_embeddings=512)
MOE = dict(n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, moe_shared_expert_intermediate_size=48,
           n_group=2, topk_group=1, routed_scaling_factor=2.5)


def _configs(small: bool) -> dict:
    """transformers' configs: toy sizes (the published configs' hybrid_override_pattern, and layers_block_type as
    5.24 saves it; MoE blocks beside the others), or the class's defaults (its default blocks M, E, *, -; a
    pattern without MoE)."""
    if not small:
        return {"defaults": transformers.NemotronHConfig(),
                "no_moe": transformers.NemotronHConfig(hybrid_override_pattern="M-M-M*-")}
    return {"pattern": transformers.NemotronHConfig(hybrid_override_pattern="M-M*-M", **TOY),
            "blocks": transformers.NemotronHConfig(layers_block_type=["mlp", "linear_attention", "full_attention"],
                                                   use_conv_bias=False, use_bias=True, mlp_bias=True, **TOY),
            "moe": transformers.NemotronHConfig(hybrid_override_pattern="ME*-E", **TOY, **MOE)}


@pytest.mark.parametrize("small", [True, False])
def test_parameter_counts_equal_transformers_on_the_meta_device(small, tmp_path):
    for name, c in _configs(small).items():
        c.save_pretrained(tmp_path / name)
        ours = model_params(load_model(str(tmp_path / name)))
        with torch.device("meta"):
            hf = transformers.AutoModelForCausalLM.from_config(c)
        assert ours == stored_params(hf), name


def test_the_toy_reads_as_the_hybrid_it_is(tmp_path):
    _configs(True)["pattern"].save_pretrained(tmp_path)
    m = load_model(str(tmp_path))
    assert (m.layer_types, m.no_mlp_layers, m.nope_layers) == (HYB.layer_types, HYB.no_mlp_layers, (3,))
    assert (m.mamba_heads, m.mamba_head_dim, m.mamba_state, m.mamba_groups, m.mamba_conv, m.mamba_chunk,
            m.mamba_conv_bias, m.mamba_proj_bias, m.activation) == (4, 8, 16, 2, 4, 32, True, False, "relu2")
    assert model_params(m) == model_params(HYB) == 103_140
    names = {w.hf for o in model_ops(m) for w in o.weights}
    assert {"model.embeddings.weight", "model.norm_f.weight", "norm.weight", "mixer.in_proj.weight", "mixer.A_log",
            "mixer.norm.weight", "mixer.q_proj.weight", "mixer.up_proj.weight"} <= names


def test_moe_blocks_read_as_relu2_experts_beside_a_shared_one(tmp_path):
    _configs(True)["moe"].save_pretrained(tmp_path)
    m = load_model(str(tmp_path))
    assert (m.layer_types, m.moe_layers, m.dense_layers) == (("mamba", "mlp", "full", "mlp", "mlp"), (1, 4), (3,))
    assert (m.n_experts, m.n_active, m.moe_intermediate, m.shared_intermediate, m.expert_activation) == (
        8, 2, 32, 48, "relu2")
    assert (m.router, m.router_correction, m.n_group, m.topk_group, m.routed_scale, m.norm_topk) == (
        "sigmoid_group", True, 2, 1, 2.5, True)
    ops = {o.name: o for o in model_ops(m)}
    assert [w.key for w in ops["experts"].weights] == ["experts_up", "experts_down"]       # no gate
    assert "shared_gate_proj" not in ops and ops["shared_relu2"].dims == {"width": 48, "fn": "relu2"}
    # one expert: up [64, 32] and down [32, 64] in bf16, in each of the 2 MoE layers
    assert W.decode(m, 1, 16).per_expert_bytes == 2 * (2 * 64 * 32 * 2)


def test_latent_experts_and_other_state_dtypes_are_refused_in_one_line(tmp_path):
    transformers.NemotronHConfig(hybrid_override_pattern="ME*", moe_latent_size=16, **TOY,
                                 **MOE).save_pretrained(tmp_path / "latent")
    with pytest.raises(RooflineError, match="moe_latent_size = 16 .* the experts' latent projections"):
        load_model(str(tmp_path / "latent"))
    transformers.NemotronHConfig(hybrid_override_pattern="M*", mamba_ssm_cache_dtype="bfloat16",
                                 **TOY).save_pretrained(tmp_path / "bf16")
    with pytest.raises(RooflineError, match="mamba_ssm_cache_dtype = .* an SSM state held in another dtype"):
        load_model(str(tmp_path / "bf16"))


@pytest.mark.parametrize("seq", [100, 128])
def test_moe_prefill_flops_match_flopcountermode_after_the_conventions(seq, tmp_path):
    c = _configs(True)["moe"]
    c.save_pretrained(tmp_path)
    cfg = load_model(str(tmp_path))
    theirs = flop_split(c, seq)
    ph = W.prefill(cfg, 1, seq, act_dtype="fp32")
    kinds = {o.name: o.kind for o in model_ops(cfg)}
    ours = {k: sum(o.total.flops for o in ph.ops if kinds[o.name] == k) for k in ("linear", "router", "experts")}
    n, T, k, H, I, E = 2, seq, 2, 64, 32, 8
    # the conventions: ours counts the routing (the sigmoid, the groups' top-k, the renorm) and the experts'
    # relu2 (2 per element), routing-weight multiply and k-way sum, which FlopCounterMode does not
    assert ours["linear"] == theirs["linear"]
    routing = F.routing(T, E, k, kind="sigmoid_group", n_group=2, score_bias=True).flops
    assert ours["router"] - n * routing == theirs["router"] == n * 2 * T * H * E
    assert ours["experts"] - n * (2 * T * k * I + T * k * H + T * (k - 1) * H) == theirs["experts"]
    assert theirs["experts"] == n * 2 * T * k * 2 * H * I


@pytest.mark.parametrize("seq", [100, 128])
def test_prefill_flops_match_flopcountermode_after_the_conventions(seq, tmp_path):
    c = _configs(True)["pattern"]
    c.save_pretrained(tmp_path)
    cfg = load_model(str(tmp_path))
    theirs = flop_split(c, seq)
    ph = W.prefill(cfg, 1, seq, act_dtype="fp32")
    kinds = {o.name: o.kind for o in model_ops(cfg)}
    ours = {k: sum(o.total.flops for o in ph.ops if kinds[o.name] == k)
            for k in ("linear", "conv1d", "ssd_scan", "attention")}
    n, K, ch, chunks = len(cfg.mamba_layers), cfg.mamba_conv, 96, F.ssd_chunks(seq, 32)
    # the conventions: ours counts the conv's SiLU (4 per element) and bias add (1), which FlopCounterMode does not;
    # torch's conv1d computes seq + K - 1 outputs and drops K - 1; the torch path passes the states between chunks
    # by a dense [chunks + 1]^2 product (2 (chunks + 1)^2 head_dim d_state per head), ours by the kernel's scan
    # (2 head_dim d_state per chunk and head); eager attention multiplies the whole seq x seq score matrix
    conv = ours["conv1d"] - n * 5 * seq * ch
    scan = ours["ssd_scan"] + n * 4 * (2 * (chunks + 1) ** 2 - 2 * chunks) * 8 * 16
    assert conv == pytest.approx(theirs["conv"] * seq / (seq + K - 1), rel=1e-12)
    assert scan == theirs["scan"]
    assert ours["attention"] == pytest.approx(theirs["attention"] / 2, rel=0.02)
    assert ours["linear"] == theirs["linear"]


# ---- explain, and the run paths

def test_explain_prints_the_split_per_kind(tmp_path):
    from roofline.devices import find_device
    from roofline.explain import ExplainSpec, explain_step

    # NemotronHConfig's default sizes, 28 blocks "M-M-M*-" x 4: 12 Mamba-2, 4 attention, 12 MLP
    transformers.NemotronHConfig(hybrid_override_pattern="M-M-M*-" * 4,
                                 max_position_embeddings=262144).save_pretrained(tmp_path)
    m = load_model(str(tmp_path))
    # per Mamba-2 layer: 128 heads x 64 x 128 x 4 bytes of SSM state + (8,192 + 2 x 8 x 128) channels x 3 x 2 conv
    assert state_bytes(m) == 12 * (4_194_304 + 61_440) == 51_068_928
    spec = ExplainSpec(m, find_device("h100"), phase="decode", batch=1, context=131072)
    text = explain_step(spec).text()
    # 4 layers x 131,072 tokens x 8 KV heads x 128 x 2 (K, V) x 2 bytes = 2.15 GB
    assert ("at context 131,072: 4 attention layers read 2.15 GB of KV, 12 Mamba-2 layers read 51.1 MB of state"
            in text)


def test_the_model_runs_every_block_kind_and_refuses_what_has_no_kernels_in_one_line(monkeypatch):
    """The toy's Mamba-2, attention-only and MLP-only blocks run in our model, and Falcon-H1's "hybrid" layers
    (attention and Mamba-2 side by side) too (tests/test_hf_parity_mamba.py checks the logits against transformers');
    a layer kind registered in roofline.layer.NOT_RUN (none is now) is refused by name before anything runs."""
    import torch

    from kernels.model import LlamaModel
    from roofline import layer as LY

    m = LlamaModel(HYB, dtype="fp32", backend="torch", max_len=16)
    full = m.forward_full(torch.tensor([[5, 6, 7, 8]]))
    assert torch.allclose(m.prefill(torch.tensor([5, 6, 7, 8]), 0), full[3], atol=1e-5, rtol=1e-5)
    hybrid = ModelConfig("toy-falcon", 64, 96, 2, 4, 2, 256, 512, head_dim=16,
                         layer_types=("hybrid", "hybrid"), mamba_heads=4, mamba_head_dim=8, mamba_state=16,
                         mamba_groups=2, mamba_conv=4, mamba_chunk=32)
    assert LY.NOT_RUN == {}
    LlamaModel(hybrid, dtype="fp32", backend="torch", max_len=16).forward_full(torch.tensor([[5, 6, 7]]))
    monkeypatch.setitem(LY.NOT_RUN, "hybrid", "Mamba-2 beside attention")
    with pytest.raises(RooflineError) as e:        # latency's and serve's model
        LlamaModel(hybrid, dtype="fp32", backend="torch")
    assert str(e.value) == ("toy-falcon: Mamba-2 beside attention layers are costed but not run yet: roofline "
                            "explain and the cost commands take this model; profile, latency, serve and check do not.")


# ---- Granite-4.0-H (granitemoehybrid): Mamba-2 and attention mixers, each layer with its MLP

GRANITE_TOY = dict(vocab_size=256, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
                   shared_intermediate_size=80, mamba_n_heads=4, mamba_d_state=16, mamba_n_groups=2, mamba_d_conv=4,
                   mamba_chunk_size=32, max_position_embeddings=512, num_hidden_layers=4,
                   layer_types=["mamba", "attention", "mamba", "mamba"])


def _granite(small: bool) -> dict:
    """Toy sizes (routed experts beside the shared MLP, or the shared MLP alone), or the class's defaults (every
    layer Mamba-2, 8 experts) and a dense one with RoPE and projection biases."""
    G = transformers.GraniteMoeHybridConfig
    if not small:
        return {"defaults": G(), "dense_rope": G(num_local_experts=0, position_embedding_type="rope",
                                                 mamba_proj_bias=True)}
    return {"moe": G(num_local_experts=4, embedding_multiplier=12.0, residual_multiplier=0.22, **GRANITE_TOY),
            "dense": G(num_local_experts=0, **GRANITE_TOY)}


@pytest.mark.parametrize("small", [True, False])
def test_granite_h_parameter_counts_equal_transformers_on_the_meta_device(small, tmp_path):
    for name, c in _granite(small).items():
        c.save_pretrained(tmp_path / name)
        ours = model_params(load_model(str(tmp_path / name)))
        with torch.device("meta"):
            hf = transformers.AutoModelForCausalLM.from_config(c)
        assert ours == sum(p.numel() for p in hf.parameters()), name


def test_granite_h_reads_its_layers_multipliers_and_mlp(tmp_path):
    _granite(True)["moe"].save_pretrained(tmp_path / "moe")
    m = load_model(str(tmp_path / "moe"))
    # d_head "auto": mamba_expand 2 x 64 / 4 heads = 32
    assert (m.layer_types, m.nope_layers, m.no_mlp_layers) == (("mamba", "full", "mamba", "mamba"), (1,), ())
    assert (m.mamba_heads, m.mamba_head_dim, m.mamba_state, m.mamba_groups, m.mamba_chunk) == (4, 32, 16, 2, 32)
    assert (m.n_experts, m.n_active, m.moe_intermediate, m.shared_intermediate, m.router) == (4, 2, 48, 80,
                                                                                            "topk_softmax")
    assert (m.embed_multiplier, m.residual_multiplier, m.query_scale) == (12.0, 0.22, 1.0)
    # per sequence: 3 layers x (4 x 32 x 16 x 4 SSM + (128 + 2 x 2 x 16) channels x 3 x 2 conv)
    assert state_bytes(m) == 3 * (8_192 + 1_152) == 28_032
    _granite(True)["dense"].save_pretrained(tmp_path / "dense")
    d = load_model(str(tmp_path / "dense"))
    assert (d.n_experts, d.intermediate) == (0, 80)      # the shared MLP alone: a dense SwiGLU of 80


@pytest.mark.parametrize("seq", [100, 128])
def test_granite_h_prefill_flops_match_flopcountermode_after_the_conventions(seq, tmp_path):
    c = _granite(True)["dense"]
    c.save_pretrained(tmp_path)
    cfg = load_model(str(tmp_path))
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(c, attn_implementation="eager").eval()
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        model(input_ids=torch.zeros(1, seq, dtype=torch.long), use_cache=False, logits_to_keep=1)
    got = counter.get_flop_counts()["Global"]
    theirs = {k: sum(v for op, v in got.items() if k in str(op)) for k in ("aten.mm", "convolution", "bmm")}
    ph = W.prefill(cfg, 1, seq, act_dtype="fp32")
    kinds = {o.name: o.kind for o in model_ops(cfg)}
    ours = {k: sum(o.total.flops for o in ph.ops if kinds[o.name] == k)
            for k in ("linear", "conv1d", "ssd_scan", "attention")}
    n, K, ch, chunks = 3, 4, 128 + 64, F.ssd_chunks(seq, 32)
    # the conventions of the Nemotron-H test above (d_head 32); bmm holds the scan's einsums and eager attention's
    # whole seq x seq products (ours: the causal half, within 2%)
    scan = ours["ssd_scan"] + n * 4 * (2 * (chunks + 1) ** 2 - 2 * chunks) * 32 * 16
    assert ours["linear"] == theirs["aten.mm"]
    assert ours["conv1d"] - n * 5 * seq * ch == pytest.approx(theirs["convolution"] * seq / (seq + K - 1), rel=1e-12)
    assert scan + 2 * ours["attention"] == pytest.approx(theirs["bmm"], rel=0.02)


# ---- Falcon-H1 (falcon_h1): attention and Mamba-2 side by side in every layer, muP multipliers

FALCON_TOY = dict(vocab_size=256, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
                  mamba_d_ssm=64, mamba_n_heads=4, mamba_d_state=16, mamba_n_groups=2, mamba_d_conv=4,
                  mamba_chunk_size=32, max_position_embeddings=512, num_hidden_layers=3)
FALCON_MUP = dict(mamba_rms_norm=True, key_multiplier=0.5, ssm_multipliers=[1.0, 2.0, 1.0, 1.0, 1.0],
                  mlp_multipliers=[0.5, 2.0], lm_head_multiplier=0.25, embedding_multiplier=3.0)


def _falcon(small: bool) -> dict:
    F1 = transformers.FalconH1Config
    if not small:
        return {"defaults": F1()}
    return {"plain": F1(**FALCON_TOY), "mup": F1(**FALCON_MUP, **FALCON_TOY)}


@pytest.mark.parametrize("small", [True, False])
def test_falcon_h1_parameter_counts_equal_transformers_on_the_meta_device(small, tmp_path):
    for name, c in _falcon(small).items():
        c.save_pretrained(tmp_path / name)
        ours = model_params(load_model(str(tmp_path / name)))
        with torch.device("meta"):
            hf = transformers.AutoModelForCausalLM.from_config(c)
        assert ours == sum(p.numel() for p in hf.parameters()), name


def test_falcon_h1_runs_both_mixers_and_its_multipliers_where_they_run(tmp_path):
    _falcon(True)["mup"].save_pretrained(tmp_path)
    m = load_model(str(tmp_path))
    assert m.layer_types == ("hybrid",) * 3 and m.attention_layers == m.mamba_layers == (0, 1, 2)
    assert (m.mamba_heads, m.mamba_head_dim, m.mamba_norm, m.embed_multiplier, m.logits_scaling) == (4, 16, True,
                                                                                                    3.0, 4.0)
    names = [o.name for o in model_ops(m)]
    # the multipliers that are not 1, each after (or before) the op it scales; the two mixers' outputs summed
    for a, b in (("k_proj", "key_scale"), ("in_proj", "ssm_mup_scale"), ("gate_proj", "mlp_gate_scale"),
                 ("down_proj", "mlp_down_scale"), ("mixer_sum", "attn_residual")):
        assert names.index(b) == names.index(a) + 1, (a, b)
    assert not {"ssm_in_scale", "ssm_out_scale", "attn_in_scale", "attn_out_scale", "ssm_gate"} & set(names)
    ph = W.prefill(m, 2, 100)
    cost = {o.name: o.total for o in ph.ops}
    # 3 layers x 200 rows: k (2 x 16 = 32 wide), the mup vector over in_proj's 64 + 64 + 32 + 32 + 4 = 196 outputs
    assert (cost["key_scale"].flops, cost["key_scale"].bytes) == (3 * 200 * 32, 3 * 200 * 32 * 2 * 2)
    assert cost["ssm_mup_scale"].flops == 3 * 200 * 196
    assert cost["mixer_sum"].flops == 3 * 200 * 64
    # the state: 3 layers x (4 x 16 x 16 x 4 SSM + (64 + 2 x 2 x 16) channels x 3 x 2 conv)
    assert state_bytes(m) == 3 * (4_096 + 768) == 14_592
    _falcon(True)["plain"].save_pretrained(tmp_path / "plain")
    plain = [o.name for o in model_ops(load_model(str(tmp_path / "plain")))]
    assert "ssm_gate" in plain and "gated_norm" not in plain and "key_scale" not in plain   # y x silu(z) alone


def test_falcon_h1_refuses_a_projector_bias_unlike_in_proj_s(tmp_path):
    transformers.FalconH1Config(projectors_bias=True, **FALCON_TOY).save_pretrained(tmp_path)
    with pytest.raises(RooflineError, match=r"projectors_bias = true \(a boolean\) differs from mamba_proj_bias"):
        load_model(str(tmp_path))


@pytest.mark.parametrize("name", ["plain", "mup"])
def test_falcon_h1_prefill_flops_match_flopcountermode_after_the_conventions(name, tmp_path):
    seq = 100
    c = _falcon(True)[name]
    c.save_pretrained(tmp_path)
    cfg = load_model(str(tmp_path))
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(c, attn_implementation="eager").eval()
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        model(input_ids=torch.zeros(1, seq, dtype=torch.long), use_cache=False, logits_to_keep=1)
    got = counter.get_flop_counts()["Global"]
    theirs = {k: sum(v for op, v in got.items() if k in str(op)) for k in ("aten.mm", "convolution", "bmm")}
    ph = W.prefill(cfg, 1, seq, act_dtype="fp32")
    kinds = {o.name: o.kind for o in model_ops(cfg)}
    ours = {k: sum(o.total.flops for o in ph.ops if kinds[o.name] == k)
            for k in ("linear", "conv1d", "ssd_scan", "attention")}
    n, K, ch, chunks = 3, 4, 64 + 64, F.ssd_chunks(seq, 32)
    scan = ours["ssd_scan"] + n * 4 * (2 * (chunks + 1) ** 2 - 2 * chunks) * 16 * 16
    assert ours["linear"] == theirs["aten.mm"]
    assert ours["conv1d"] - n * 5 * seq * ch == pytest.approx(theirs["convolution"] * seq / (seq + K - 1), rel=1e-12)
    assert scan + 2 * ours["attention"] == pytest.approx(theirs["bmm"], rel=0.02)


def test_falcon_h1_explain_splits_kv_and_state(tmp_path):
    from roofline.devices import find_device
    from roofline.explain import ExplainSpec, explain_step

    # FalconH1Config's defaults: 32 layers, each with attention (8 KV heads x 128) and Mamba-2 (128 heads x 8,
    # d_state 256, one group; conv over 1,024 + 2 x 256 channels)
    transformers.FalconH1Config(max_position_embeddings=262144).save_pretrained(tmp_path)
    m = load_model(str(tmp_path))
    assert state_bytes(m) == 32 * (128 * 8 * 256 * 4 + 1_536 * 3 * 2) == 33_849_344
    text = explain_step(ExplainSpec(m, find_device("h100"), phase="decode", batch=1, context=131072)).text()
    assert ("at context 131,072: 32 attention layers read 17.2 GB of KV, 32 Mamba-2 layers read 33.8 MB of state"
            in text)



def test_falcon_h1_heads_that_miss_the_mamba_width_are_refused_as_transformers_refuses_them(tmp_path):
    # 24 heads x 64 = 1,536 against mamba_d_ssm's default 1,024 (FalconH1Config raises a ValueError too)
    d = dict(FALCON_TOY, model_type="falcon_h1", hidden_size=1024, mamba_n_heads=24, mamba_d_head=64)
    del d["mamba_d_ssm"]
    (tmp_path / "config.json").write_text(__import__("json").dumps(d))
    with pytest.raises(RooflineError, match=r"mamba_n_heads = 24 x mamba_d_head 64 must be the Mamba width \(1024\)"):
        load_model(str(tmp_path))
    with pytest.raises(Exception, match="mamba_n_heads must divide"):      # transformers' validation error
        transformers.FalconH1Config(**{k: v for k, v in d.items() if k != "model_type"})


# a Granite-4.0-H-style config.json as published ones spell it ("mamba" / "attention" layer types,
# position_embedding_type "nope", normalization_function), at a small size (a documentation page's example)
GRANITE_H_PUBLISHED = {
    "architectures": ["GraniteMoeHybridForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "attention_multiplier": 0.015625, "bos_token_id": 0, "eos_token_id": 0, "embedding_multiplier": 12,
    "hidden_act": "silu", "hidden_size": 512, "initializer_range": 0.1, "intermediate_size": 1024,
    "layer_types": ["mamba", "mamba", "mamba", "attention", "mamba", "mamba", "mamba", "attention"],
    "logits_scaling": 2, "mamba_chunk_size": 256, "mamba_conv_bias": True, "mamba_d_conv": 4, "mamba_d_head": 128,
    "mamba_d_state": 128, "mamba_expand": 2, "mamba_n_groups": 1, "mamba_n_heads": 8, "mamba_proj_bias": False,
    "max_position_embeddings": 4096, "model_type": "granitemoehybrid", "normalization_function": "rmsnorm",
    "num_attention_heads": 8, "num_experts_per_tok": 2, "num_hidden_layers": 8, "num_key_value_heads": 8,
    "num_local_experts": 8, "output_router_logits": False, "position_embedding_type": "nope",
    "residual_multiplier": 0.22, "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 10000,
    "router_aux_loss_coef": 0.0, "shared_intermediate_size": 512, "tie_word_embeddings": True,
    "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": 49152}


def test_granite_h_published_spelling_reads_with_transformers_parameter_count(tmp_path):
    (tmp_path / "config.json").write_text(__import__("json").dumps(GRANITE_H_PUBLISHED))
    m = load_model(str(tmp_path))
    assert (len(m.mamba_layers), m.attention_layers, m.nope_layers) == (6, (3, 7), (3, 7))
    assert (m.query_scale, m.embed_multiplier, m.residual_multiplier, m.logits_scaling) == (0.015625, 12, 0.22, 2)
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(tmp_path))
    assert model_params(m) == sum(p.numel() for p in hf.parameters())
    # 6 Mamba-2 layers x (8 x 128 x 128 x 4 + (1,024 + 2 x 128) x 3 x 2); 2 attention layers x 8 KV heads x 64
    assert state_bytes(m) == 6 * (524_288 + 7_680) == 3_191_808
    assert kv_bytes(m, 1, 4096) == 2 * 4096 * 8 * 64 * 2 * 2 + 3_191_808


def test_decode_step_flops_match_flopcountermode_after_the_conventions(tmp_path):
    """One decode step after 40 cached tokens, transformers' torch path: the scan's read-out S C (2 head_dim d_state
    per head) is its only product; ours adds the state's decay and input (3 per state element) and the D skip
    (2 per channel). Its conv update convolves the cached kernel columns and the new one (2 outputs, 1 kept);
    ours one, with its SiLU and bias. Decode attention over 41 keys is the same count."""
    c = _configs(True)["pattern"]
    c.save_pretrained(tmp_path)
    cfg = load_model(str(tmp_path))
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(c, attn_implementation="eager").eval()
    from torch.utils.flop_counter import FlopCounterMode

    with torch.no_grad():
        cache = model(input_ids=torch.zeros(1, 40, dtype=torch.long), use_cache=True).past_key_values
        counter = FlopCounterMode(display=False)
        with counter:
            model(input_ids=torch.zeros(1, 1, dtype=torch.long), cache=cache, use_cache=True)
    counts, root = counter.get_flop_counts(), type(model).__name__
    theirs = {"conv": 0, "scan": 0, "attention": 0}
    for fqn, m in model.named_modules():
        got = {str(k): v for k, v in counts.get(f"{root}.{fqn}", {}).items()}
        if type(m).__name__ == "NemotronHMamba2Mixer":
            theirs["conv"] += got.get("aten.convolution", 0)
            theirs["scan"] += got.get("aten.bmm", 0)
        elif type(m).__name__ == "NemotronHAttention":
            theirs["attention"] += got.get("aten.bmm", 0)
    ours = {o.name: o.total.flops for o in W.decode(cfg, 1, 40, act_dtype="fp32").ops}
    n, h, p, s, ch = 3, 4, 8, 16, 96
    assert ours["ssd_scan"] - n * h * (3 * p * s + 2 * p) == theirs["scan"] == n * h * 2 * p * s
    assert ours["conv1d"] - n * 5 * ch == theirs["conv"] / 2
    assert ours["attention"] == theirs["attention"]
