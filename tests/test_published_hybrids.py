"""Issue 32's "Done when" on the published models: Qwen3-Next-80B-A3B, Qwen3.5-397B-A17B, Qwen3.6-35B-A3B,
Nemotron-3-Nano-30B-A3B, Falcon-H1-7B, DeepSeek-V3.2 and GLM-5, each from its published config.json
(tests/data/hf_configs/hybrid/, the README there gives every file's sources), checked exactly:

- the parameter count equals transformers' on the meta device (a multimodal wrapper: its text model), pinned;
- KV plus state bytes (``roofline.capacity``, a decode step's reads) equal a hand count written out below from the
  config's numbers, at contexts 4,096 and 131,072: a hybrid's state constant in the context, a DSA model's decode
  reading its latents capped at index_topk and the indexer's keys over every token;
- prefill FLOPs within 2% of FlopCounterMode's count of transformers' forward (tests/hf_counts.py) on the config
  with its layers cut to a prefix that holds every kind of layer (nothing else shrunk: the meta device needs no
  memory), after the stated conventions;
- ``roofline explain --model <file>`` exits 0 and prints the per-kind split line;

and the presets cited from these files are the published configs, field for field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from roofline import formulas as F
from roofline import workload as W
from roofline.capacity import index_bytes, kv_bytes, state_bytes
from roofline.errors import RooflineError
from roofline.layer import model_ops, model_params
from roofline.models import PRESETS, load_model

HYBRID = Path(__file__).parent / "data" / "hf_configs" / "hybrid"
CONTEXTS = (4096, 131072)

# file stem -> (its layers cut to a prefix holding every kind, prompt tokens for the FLOP count, the kinds)
MODELS = {
    "qwen3-next-80b-a3b-instruct": (4, 300, ("linear", "attention", "moe")),   # 3 Gated DeltaNet layers, 1 full
    "qwen3.5-397b-a17b": (4, 300, ("linear", "attention", "moe")),
    "qwen3.6-35b-a3b": (4, 300, ("linear", "attention", "moe")),
    "nemotron-3-nano-30b-a3b": (6, 300, ("mamba", "attention", "moe")),        # its first blocks: "MEMEM*"
    "falcon-h1-7b-instruct": (1, 300, ("mamba", "attention")),     # attention and Mamba-2 side by side in each
    "deepseek-v3.2": (4, 2560, ("attention", "moe", "dense")),     # 3 dense layers, then MoE; past index_topk
    "glm-5": (4, 2560, ("attention", "moe", "dense")),
}
# the text model's parameters, ours and transformers' (its routers' correction biases, buffers there, with them)
PARAMS = {
    "qwen3-next-80b-a3b-instruct": 79_674_391_296,
    "qwen3.5-397b-a17b": 396_346_350_336,
    "qwen3.6-35b-a3b": 34_660_610_688,
    "nemotron-3-nano-30b-a3b": 31_577_940_288,
    "falcon-h1-7b-instruct": 7_585_648_736,
    "deepseek-v3.2": 671_877_944_064,
    "glm-5": 743_911_218_432,
}


def published(stem: str) -> dict:
    return json.loads((HYBRID / f"{stem}.json").read_text())


def model(stem: str):
    return load_model(HYBRID / f"{stem}.json")


def test_every_published_file_is_here_and_reads():
    assert sorted(p.stem for p in HYBRID.glob("*.json")) == sorted(MODELS)
    for stem in MODELS:
        assert model_params(model(stem)) == PARAMS[stem], stem


# ---- (a) parameters: transformers' on the meta device

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from hf_counts import flop_split, stored_params  # noqa: E402  (transformers' own counts)


def hf_config(d: dict):
    """transformers' config of a published file: its text model for a multimodal wrapper; without the
    quantization_config (how the weights are stored, not the model's shapes)."""
    d = {k: v for k, v in d.items() if k != "quantization_config"}
    c = transformers.CONFIG_MAPPING[d["model_type"]].from_dict(d)
    return c.get_text_config() if "text_config" in d else c


@pytest.mark.parametrize("stem", sorted(MODELS))
def test_parameters_equal_transformers_on_the_meta_device(stem):
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(hf_config(published(stem)))
    assert model_params(model(stem)) == stored_params(hf) == PARAMS[stem]


def test_the_counts_agree_with_the_checkpoints_own_inventories():
    # Qwen3.6-35B-A3B's checkpoint, header by header (the reference the README cites): the embedding, 40 blocks,
    # the final norm and lm_head; its MTP module and vision tower are not part of a text step
    assert PARAMS["qwen3.6-35b-a3b"] == 508_559_360 + 33_643_489_920 + 508_561_408
    # Qwen3-Next-80B-A3B-Instruct's 81,324,862,720 stored parameters hold one MTP layer beside ours: its fc
    # (2,048 x 4,096), a gated-attention layer (q and gate 8,192 x 2,048, k and v 512 x 2,048 each, o 2,048 x
    # 4,096, q/k norms of 256), 512 experts of 3 x 512 x 2,048, the router, the shared expert and its gate, the
    # layer's two norms and the module's three (norm, pre_fc_norm_embedding, pre_fc_norm_hidden)
    mtp = (2048 * 4096 + (8192 + 2 * 512) * 2048 + 2048 * 4096 + 2 * 256 + 512 * 3 * 512 * 2048 + 512 * 2048
           + 3 * 512 * 2048 + 2048 + 2 * 2048 + 3 * 2048)
    assert PARAMS["qwen3-next-80b-a3b-instruct"] + mtp == 81_324_862_720
    # GLM-5.1's checkpoint (GLM-5's shapes: the README says where) stores 753,864,139,008: ours with a 79th layer
    # (its MTP layer: MoE, with its indexer), that layer's eh_proj (6,144 x 12,288), enorm, hnorm and shared_head.norm
    assert model_params(model("glm-5").with_layers(79)) + 6144 * 12288 + 3 * 6144 == 753_864_139_008


# ---- (b) KV and state bytes, by hand

def _deltanet_state(v_heads, k_heads, k_dim, v_dim, conv):
    """One Gated DeltaNet layer, per sequence: the fp32 recurrent state (v_heads x k_dim x v_dim) and the bf16
    conv state (q, k, v channels x conv - 1 columns)."""
    return v_heads * k_dim * v_dim * 4 + (2 * k_heads * k_dim + v_heads * v_dim) * (conv - 1) * 2


def _mamba_state(heads, head_dim, d_state, groups, conv):
    """One Mamba-2 layer, per sequence: the fp32 SSM state and the bf16 conv state (x, B, C channels)."""
    return heads * head_dim * d_state * 4 + (heads * head_dim + 2 * groups * d_state) * (conv - 1) * 2


# stem -> (attention layers, bf16 KV bytes per token and layer: 2 (K, V) x KV heads x head_dim x 2, state bytes)
HAND = {
    "qwen3-next-80b-a3b-instruct": (12, 2 * 2 * 256 * 2, 36 * _deltanet_state(32, 16, 128, 128, 4)),
    "qwen3.5-397b-a17b": (15, 2 * 2 * 256 * 2, 45 * _deltanet_state(64, 16, 128, 128, 4)),
    "qwen3.6-35b-a3b": (10, 2 * 2 * 256 * 2, 30 * _deltanet_state(32, 16, 128, 128, 4)),
    "nemotron-3-nano-30b-a3b": (6, 2 * 2 * 128 * 2, 23 * _mamba_state(64, 64, 128, 8, 4)),
    "falcon-h1-7b-instruct": (44, 2 * 2 * 128 * 2, 44 * _mamba_state(24, 128, 256, 1, 4)),
}
# stem -> (MLA layers, bf16 latent bytes per token and layer: (kv_lora_rank + qk_rope_head_dim) x 2, indexer
# layers, fp8 key bytes per token and layer: index_head_dim + an fp32 scale per 128, index_topk)
DSA = {
    "deepseek-v3.2": (61, (512 + 64) * 2, 61, 128 + 4, 2048),
    "glm-5": (78, (512 + 64) * 2, 78, 128 + 4, 2048),
}


def test_the_hand_counts_written_out():
    assert HAND["qwen3-next-80b-a3b-instruct"][2] == 36 * (2_097_152 + 49_152) == 77_266_944
    assert HAND["qwen3.5-397b-a17b"][2] == 45 * (4_194_304 + 73_728) == 192_061_440
    assert HAND["qwen3.6-35b-a3b"][2] == 30 * (2_097_152 + 49_152) == 64_389_120
    assert HAND["nemotron-3-nano-30b-a3b"][2] == 23 * (2_097_152 + 36_864) == 49_082_368
    assert HAND["falcon-h1-7b-instruct"][2] == 44 * (3_145_728 + 21_504) == 139_358_208


@pytest.mark.parametrize("stem", sorted(HAND))
@pytest.mark.parametrize("ctx", CONTEXTS)
def test_hybrid_kv_plus_state_bytes_equal_the_hand_count(stem, ctx):
    m = model(stem)
    layers, per_token, state = HAND[stem]
    kv = layers * ctx * per_token
    assert len(m.attention_layers) == layers and state_bytes(m) == state
    assert kv_bytes(m, 1, ctx) == kv + state
    ph = W.decode(m, 1, ctx)
    assert (ph.kv_cache_read_bytes, ph.state_read_bytes) == (kv, state)      # the state: constant in the context


@pytest.mark.parametrize("stem", sorted(DSA))
@pytest.mark.parametrize("ctx", CONTEXTS)
def test_dsa_kv_bytes_equal_the_hand_count_and_the_decode_read_is_capped(stem, ctx):
    m = model(stem)
    mla, latent, indexed, key, topk = DSA[stem]
    assert (len(m.attention_layers), len(m.index_layers), m.index_topk, state_bytes(m)) == (mla, indexed, topk, 0)
    assert index_bytes(m, ctx) == indexed * ctx * key
    assert kv_bytes(m, 1, ctx) == mla * ctx * latent + indexed * ctx * key
    ph = W.decode(m, 1, ctx)
    assert ph.selected_tokens == min(ctx, topk) == 2048
    assert ph.kv_cache_read_bytes == mla * 2048 * latent            # the top-k latents, whatever the context
    assert ph.index_read_bytes == indexed * ctx * key               # the indexer scores every key


# ---- (c) prefill FLOPs against FlopCounterMode, the layers cut to a prefix holding every kind

def shrunk(d: dict, layers: int) -> dict:
    """The published config with its first ``layers`` layers (its per-layer lists cut with them)."""
    d = json.loads(json.dumps(d))
    t = d.get("text_config", d)
    t["num_hidden_layers"] = layers
    for k in ("layer_types", "mlp_layer_types", "indexer_types"):
        if t.get(k) is not None:
            t[k] = t[k][:layers]
    if t.get("hybrid_override_pattern"):
        t["hybrid_override_pattern"] = t["hybrid_override_pattern"][:layers]
    return d


# our op kinds FlopCounterMode counts, by tests/hf_counts.py's categories (the others, norms, RoPE, residuals,
# activations, gates and appends, are elementwise or copies: the counter counts none of their FLOPs)
COUNTED = {"linear": "linear", "mla_up": "linear", "gate": "linear", "conv1d": "conv", "gated_delta": "scan",
           "ssd_scan": "scan", "attention": "attention", "mla_attention": "attention", "index_scores": "indexer",
           "experts": "experts", "router": "router"}


def ours_counted(cfg, seq: int) -> tuple:
    """(ours summed into those categories, the FLOPs of Qwen's shared-expert gate that are no GEMM: its sigmoid
    gate times the shared expert's output, hidden per token and layer, inside our "gate" op)."""
    out = dict.fromkeys(set(COUNTED.values()), 0)
    kinds, gated = {o.name: o.kind for o in model_ops(cfg)}, 0
    for op in W.prefill(cfg, 1, seq, act_dtype="fp32").ops:
        if kinds[op.name] in COUNTED:
            out[COUNTED[kinds[op.name]]] += op.total.flops
        gated += op.count * seq * cfg.hidden if kinds[op.name] == "gate" else 0
    return out, gated


def theirs_in_our_conventions(cfg, theirs: dict, seq: int) -> dict:
    """FlopCounterMode's split, moved to our conventions (the same as tests/test_deltanet.py's, test_mamba.py's and
    test_dsa.py's, part by part at toy sizes)."""
    t = {k: theirs[k] for k in set(COUNTED.values())}
    dense = seq * seq
    if cfg.index_topk:      # eager attention scores every (query, key) pair under a top-k mask: ours the selected
        t["attention"] = theirs["attention"] * F.selected_pairs(seq, 0, cfg.index_topk) / dense
        t["indexer"] = theirs["indexer"] * F.selected_pairs(seq) / dense
    else:                   # eager attention multiplies the whole seq x seq square: ours the causal half
        t["attention"] = theirs["attention"] / 2
    conv = cfg.linear_conv or cfg.mamba_conv
    if conv:                # torch's conv1d computes seq + conv - 1 outputs per channel and drops conv - 1
        t["conv"] = theirs["conv"] * seq / (seq + conv - 1)
    if cfg.linear_layers:   # the UT transform's triangular solves: FlopCounterMode has no formula for them
        t["scan"] += len(cfg.linear_layers) * F.delta_solve_flops(F.delta_chunks(seq), cfg.linear_v_heads,
                                                                  cfg.linear_k_dim, cfg.linear_v_dim)
    if cfg.mamba_layers:    # the torch path passes states between chunks by a dense (chunks + 1)^2 product
        c = F.ssd_chunks(seq, cfg.mamba_chunk)
        t["scan"] -= (len(cfg.mamba_layers) * cfg.mamba_heads * (2 * (c + 1) ** 2 - 2 * c) * cfg.mamba_head_dim
                      * cfg.mamba_state)
    return t


@pytest.mark.parametrize("stem", sorted(MODELS))
def test_prefill_flops_within_two_percent_of_flopcountermode(stem, tmp_path):
    layers, seq, held = MODELS[stem]
    d = shrunk(published(stem), layers)
    (tmp_path / "config.json").write_text(json.dumps(d))
    cfg = load_model(tmp_path / "config.json")
    kinds = {"linear": cfg.linear_layers, "mamba": cfg.mamba_layers, "attention": cfg.attention_layers,
             "moe": cfg.moe_layers, "dense": cfg.dense_layers if cfg.n_experts else ()}
    assert [k for k in held if not kinds[k]] == [], kinds            # the prefix holds every kind of layer
    theirs = flop_split(hf_config(d), seq, meta=True)
    assert theirs["other"] == 0
    (ours, gated), conv = ours_counted(cfg, seq), theirs_in_our_conventions(cfg, theirs, seq)
    assert ours["linear"] - gated == theirs["linear"]               # every projection, exactly
    assert ours["scan"] == conv["scan"]                             # the delta rule / the SSD scan, exactly
    # what stays apart is ours alone: the conv's SiLU (and bias), the experts' activation, weighting and k-way
    # sum, the routing (sigmoid or softmax, top-k, renormalising), and attention's exact causal pair count
    assert sum(ours.values()) == pytest.approx(sum(conv.values()), rel=0.02)
    assert sum(ours.values()) >= sum(conv.values())


# ---- (d) roofline explain on each published file

# the hand counts above, rounded as explain prints them (e.g. 12 x 131,072 x 2,048 B = 3.22 GB of KV)
SPLIT = {
    "qwen3-next-80b-a3b-instruct": "12 attention layers read 3.22 GB of KV, 36 DeltaNet layers read 77.3 MB of state",
    "qwen3.5-397b-a17b": "15 attention layers read 4.03 GB of KV, 45 DeltaNet layers read 192 MB of state",
    "qwen3.6-35b-a3b": "10 attention layers read 2.68 GB of KV, 30 DeltaNet layers read 64.4 MB of state",
    "nemotron-3-nano-30b-a3b": "6 attention layers read 805 MB of KV, 23 Mamba-2 layers read 49.1 MB of state",
    "falcon-h1-7b-instruct": "44 attention layers read 5.91 GB of KV, 44 Mamba-2 layers read 139 MB of state",
    "deepseek-v3.2": "61 MLA layers read 144 MB of KV for 2,048 selected tokens; the indexer (61 layers) reads "
                     "1.06 GB of keys over 131,072",
    "glm-5": "78 MLA layers read 184 MB of KV for 2,048 selected tokens; the indexer (78 layers) reads 1.35 GB "
             "of keys over 131,072",
}


@pytest.mark.parametrize("stem", sorted(MODELS))
def test_explain_on_the_published_file_prints_the_split_per_kind(stem):
    from click.testing import CliRunner

    from profiler.cli import main

    r = CliRunner().invoke(main, ["explain", "--model", str(HYBRID / f"{stem}.json"), "--device", "h100",
                                  "--phase", "decode", "--batch", "1", "--context", "131072"])
    assert r.exit_code == 0, r.output
    assert f"at context 131,072: {SPLIT[stem]}" in r.output
    assert "Traceback" not in r.output


# ---- what the published files say that the readers had to learn (each refused otherwise, in one line)

def _variant(tmp_path, stem: str, text: dict = None, quant: dict = None, **top):
    d = published(stem)
    d.update(top)
    if text:
        d["text_config"] = {**d["text_config"], **text}
    if quant:
        d["quantization_config"] = {**d["quantization_config"], **quant}
    (tmp_path / "config.json").write_text(json.dumps(d))
    return tmp_path / "config.json"


def test_what_the_published_files_say_reads_and_what_they_turn_off_is_refused(tmp_path):
    # Qwen3.5 / 3.6: the mrope inside rope_parameters rotates text as plain RoPE (a quarter of each head)
    assert model("qwen3.6-35b-a3b").rotary_dim == 64
    # Qwen3-Next's use_sliding_window (false): Qwen3NextConfig reads no window
    with pytest.raises(RooflineError, match=r"use_sliding_window = true .* turns on a sliding window \(transformers' "
                                            r"Qwen3-Next attends over the whole context\), which is not modelled"):
        load_model(_variant(tmp_path, "qwen3-next-80b-a3b-instruct", use_sliding_window=True))
    # Qwen3.5-MoE's mlp_only_layers, [] as transformers prints its configs: it routes every layer
    assert load_model(_variant(tmp_path, "qwen3.6-35b-a3b", text={"mlp_only_layers": []})).dense_layers == ()
    with pytest.raises(RooflineError, match=r"mlp_only_layers = \[3\] .* turns on dense MLP layers"):
        load_model(_variant(tmp_path, "qwen3.6-35b-a3b", text={"mlp_only_layers": [3]}))
    # DeepSeek-V3.2's FP8 block scales in UE8M0 (powers of two), stored as fp32 per 128 x 128 block
    assert model("deepseek-v3.2").quantization.method == "fp8"
    with pytest.raises(RooflineError) as e:
        load_model(_variant(tmp_path, "deepseek-v3.2", quant={"scale_fmt": "e8m0"}))
    assert str(e.value) == ("quantization_config: scale_fmt 'e8m0' is not modelled (null, or ue8m0: power-of-two "
                            "scales stored in fp32).")


# ---- presets: the published files, field for field

PRESET_OF = {"qwen3-next-80b-a3b": "qwen3-next-80b-a3b-instruct", "qwen3.5-397b-a17b": "qwen3.5-397b-a17b",
             "qwen3.6-35b-a3b": "qwen3.6-35b-a3b", "deepseek-v3.2": "deepseek-v3.2", "glm-5": "glm-5"}


@pytest.mark.parametrize("name", sorted(PRESET_OF))
def test_the_preset_is_the_published_config(name):
    m, p = model(PRESET_OF[name]), PRESETS[name]
    differ = [f for f in p.__dataclass_fields__ if f not in ("name", "notes") and getattr(p, f) != getattr(m, f)]
    assert differ == []
    assert model_params(p) == PARAMS[PRESET_OF[name]]
