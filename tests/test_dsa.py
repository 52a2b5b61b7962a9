"""DeepSeek Sparse Attention (issue 32: DeepSeek-V3.2 ``deepseek_v32``, GLM-5 ``glm_moe_dsa``), costed: the indexer's
and the top-k's formulas pinned by exact integers, the layer as data (the indexer's ops on the layers that run
one), the indexer's key cache in the capacity estimate beside the latent one, a decode step's KV read capped at
the top-k, the readers' parameter counts against transformers' on the meta device, prefill FLOPs against
FlopCounterMode's count of transformers' forward (part by part, after the stated conventions), the split explain
prints, and that the run paths take both families (kernels.dsa; tests/test_dsa_kernels.py, the parity tests)."""

from __future__ import annotations

import json

import pytest

from roofline import formulas as F
from roofline import workload as W
from roofline.capacity import index_bytes, kv_bytes
from roofline.errors import RooflineError
from roofline.layer import model_ops
from roofline.models import ModelConfig, load_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from hf_counts import flop_split, stored_params  # noqa: E402  (transformers' own counts)


# ---- formulas, by hand

def test_the_indexer_key_cache_is_fp8_with_an_fp32_scale_per_128():
    assert F.index_key_bytes(128) == 128 + 4 == 132          # vLLM's DeepseekV32IndexerCache, SGLang's buffer
    assert F.index_key_bytes(256) == 264 and F.index_key_bytes(16) == 20    # a partial block keeps its scale
    assert F.index_cache_bytes(131_072, 61, 128) == 131_072 * 61 * 132 == 1_055_391_744


def test_selected_pairs_are_exact_integers():
    assert F.selected_pairs(40) == 40 * 41 // 2 == 820                      # every key up to the query's own
    assert F.selected_pairs(40, 0, 16) == 16 * 17 // 2 + 24 * 16 == 520      # min(j, 16) for j = 1..40
    assert F.selected_pairs(10, 10, 16) == sum(min(j, 16) for j in range(11, 21)) == 145
    assert F.selected_pairs(1, 131_071, 2048) == 2048 and F.selected_pairs(1, 5, 16) == 6
    assert F.selected_pairs(3, 100, 16) == 48                               # every query past the cap


def test_index_scores_topk_and_append_by_hand():
    # 2 sequences x 4 new tokens, 4 heads of 16: 10 pairs each, 2 x 4 x (16 + 1) FLOPs a pair
    c = F.index_scores(2, 4, 0, 4, 16)
    assert c.flops == 2 * 10 * 2 * 4 * 17 == 2_720
    # per sequence: 4 keys x 20 B, q 4 x 4 x 16 x 2 B + w 4 x 4 x 4 B, 10 fp32 scores
    assert c.bytes == 2 * (4 * 20 + 4 * 4 * (32 + 4) + 10 * 4) == 1_392
    d = F.index_scores(1, 1, 131_071, 64, 128)                              # DeepSeek-V3.2's decode at 131,072
    assert (d.flops, d.bytes) == (131_072 * 2 * 64 * 129, 131_072 * 132 + 64 * 260 + 131_072 * 4)
    assert (d.flops, d.bytes) == (2_164_260_864, 17_842_432)
    assert F.index_topk(1, 1, 131_071, 2048).bytes == (131_072 + 2048) * 4 == 532_480
    assert F.index_topk(2, 4, 0, 3).bytes == 2 * (10 + (1 + 2 + 3 + 3)) * 4 == 152
    assert F.index_append(10, 16).bytes == 10 * (16 * 2 + 20) == 520
    n = F.layernorm(10, 16)
    assert (n.flops, n.bytes) == (7 * 160, 2 * 160 * 2 + 2 * 16 * 2) == (1_120, 704)


def test_sparse_mla_attends_to_the_top_k_only():
    H, R, P, N, V = 4, 16, 8, 16, 16
    dec = F.mla_decode_attention(1, 4097, H, R, P, topk=16)                 # 16 latents gathered, their indices read
    assert dec.flops == 2 * H * 16 * (R + P) + 2 * H * 16 * R == 5_120
    assert dec.bytes == 16 * (R + P) * 2 + H * (2 * R + P) * 2 + 16 * 4 == 1_152
    assert F.mla_decode_attention(1, 10, H, R, P, topk=16) == F.mla_decode_attention(1, 10, H, R, P) + \
        F.Cost(0, 10 * 4)
    pre = F.mla_prefill_attention(1, 40, H, N, P, V, topk=16)               # 520 pairs of 40 queries
    assert pre.flops == 520 * 2 * H * (N + P + V) == 166_400
    dense = F.mla_prefill_attention(1, 40, H, N, P, V)
    assert pre.bytes == dense.bytes + 520 * 4


# ---- the models: tiny configs written by transformers

TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, n_group=2,
            topk_group=1, first_k_dense_replace=1, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8,
            qk_nope_head_dim=16, v_head_dim=16, index_topk=16, index_n_heads=4, index_head_dim=16,
            max_position_embeddings=512)


def _tiny(name: str):
    if name == "deepseek_v32":
        return transformers.DeepseekV32Config(**TINY)
    return transformers.GlmMoeDsaConfig(**TINY, indexer_types=["full", "shared", "full"])


def _load(c, tmp_path):
    c.save_pretrained(tmp_path)
    return load_model(str(tmp_path))


def test_the_indexer_runs_on_the_layers_that_have_one(tmp_path):
    v32 = _load(_tiny("deepseek_v32"), tmp_path / "v32")
    glm = _load(_tiny("glm_moe_dsa"), tmp_path / "glm")
    assert (v32.index_topk, v32.index_n_heads, v32.index_head_dim, v32.index_layers) == (16, 4, 16, (0, 1, 2))
    assert (glm.index_shared, glm.index_layers) == ((1,), (0, 2))
    for m, layers in ((v32, (0, 1, 2)), (glm, (0, 2))):
        ops = {o.name: o for o in model_ops(m)}
        for name in ("index_wq_b", "index_wk", "index_k_norm", "index_rope", "index_append", "index_weights",
                     "index_scores", "index_topk"):
            assert (ops[name].count, ops[name].layers) == (len(layers), layers), name
        assert ops["attention"].count == 3 and ops["attention"].dims["topk"] == 16     # every layer attends sparsely
        assert ops["index_wq_b"].dims == {"in_features": 32, "out_features": 64, "bias": False}
        assert ops["index_wk"].dims["out_features"] == 16 and ops["index_weights"].dims["out_features"] == 4
        assert ops["index_rope"].dims == {"n_heads": 4, "n_kv_heads": 1, "head_dim": 8}
        assert [w.hf for w in ops["index_k_norm"].weights] == ["self_attn.indexer.k_norm.weight",
                                                                "self_attn.indexer.k_norm.bias"]


def test_sparse_attention_needs_its_sizes_over_latent_attention():
    with pytest.raises(RooflineError, match="DeepSeek Sparse Attention needs index_topk, index_n_heads, "
                                            "index_head_dim >= 1 over latent attention with q_lora_rank"):
        ModelConfig("bad", 64, 96, 2, 4, 4, 256, 512, index_topk=16, index_n_heads=4, index_head_dim=16)
    with pytest.raises(RooflineError, match="index_shared must list layer indices 1..1"):
        ModelConfig("bad", 64, 96, 2, 4, 4, 256, 512, index_shared=(0,))


def test_the_indexer_keys_are_counted_with_the_kv_cache_and_the_decode_read_is_capped(tmp_path):
    m = _load(_tiny("glm_moe_dsa"), tmp_path)
    latent = 3 * (16 + 8) * 2                           # 3 MLA layers x (rank + rope) x bf16, per token
    keys = 2 * 20                                       # 2 indexer layers x (16 fp8 + one fp32 scale)
    assert index_bytes(m, 100) == 100 * keys
    assert kv_bytes(m, 2, 100) == 2 * 100 * (latent + keys) == 36_800
    ph = W.decode(m, 2, 100)
    assert ph.selected_tokens == 16
    assert ph.kv_cache_read_bytes == 2 * 16 * latent                     # top-k latents, not the context's
    assert ph.index_read_bytes == 2 * 100 * keys                         # the indexer reads every key
    assert W.decode(m, 2, 10).kv_cache_read_bytes == 2 * 10 * latent     # below the cap: the whole context
    pre = W.prefill(m, 2, 64, cached_tokens=48)                          # a prefill expands its whole prefix
    assert (pre.kv_cache_read_bytes, pre.index_read_bytes) == (2 * 48 * latent, 2 * 48 * keys)


def test_a_mixed_step_costs_the_indexer_per_chunk_and_per_decode_group(tmp_path):
    m = _load(_tiny("deepseek_v32"), tmp_path)
    mixed = W.mixed(m, chunks=((24, 8),), decodes=((3, 101),))
    pre, dec = W.prefill(m, 1, 32, cached_tokens=8), W.decode(m, 3, 100)
    for name in ("index_scores", "index_topk", "attention"):
        assert mixed.op(name).cost == pre.op(name).cost + dec.op(name).cost, name
    assert mixed.op("index_scores").cost.flops == (F.selected_pairs(24, 8) + 3 * 101) * 2 * 4 * 17
    assert mixed.op("attention").cost.flops == (F.selected_pairs(24, 8, 16) + 3 * 16) * 2 * 4 * 40


# ---- the readers

def test_the_published_defaults_read_as_sparse_attention(tmp_path):
    v32 = _load(transformers.DeepseekV32Config(), tmp_path / "v32")
    assert (v32.index_topk, v32.index_n_heads, v32.index_head_dim, len(v32.index_layers)) == (2048, 64, 128, 61)
    assert (v32.q_lora_rank, v32.kv_lora_rank, v32.qk_rope_dim, v32.dense_layers) == (1536, 512, 64, (0, 1, 2))
    glm = _load(transformers.GlmMoeDsaConfig(), tmp_path / "glm")
    assert (glm.index_n_heads, glm.n_layers, glm.index_shared, glm.v_head_dim) == (32, 78, (), 256)
    # 61 layers x 131,072 tokens x (576 bf16 latent + 132 B of indexer key)
    assert kv_bytes(v32, 1, 131_072) == 131_072 * 61 * (576 * 2 + 132) == 10_266_083_328


def _read(tmp_path, d: dict):
    (tmp_path / "config.json").write_text(json.dumps(d))
    return load_model(str(tmp_path))


def test_glm_5s_indexer_schedule_is_transformers(tmp_path):
    base = {**transformers.GlmMoeDsaConfig(num_hidden_layers=12).to_dict()}
    base.pop("indexer_types")
    # transformers: "full" where max(i - offset + 1, 0) % freq == 0
    m = _read(tmp_path, {**base, "index_topk_freq": 4, "index_skip_topk_offset": 3})
    theirs = transformers.GlmMoeDsaConfig(num_hidden_layers=12, index_topk_freq=4, index_skip_topk_offset=3)
    assert m.index_layers == tuple(i for i, t in enumerate(theirs.indexer_types) if t == "full") == (0, 1, 2, 6, 10)
    m = _read(tmp_path, {**base, "index_topk_pattern": "FSSF" * 3})
    assert m.index_shared == (1, 2, 5, 6, 9, 10)
    assert m.with_layers(4).index_shared == (1, 2) and m.with_layers(1).index_shared == ()    # shrunk: its own
    note = _read(tmp_path, {**base, "indexer_rope_interleave": False}).notes
    assert any(n.startswith("indexer_rope_interleave = false (a boolean) rotates the indexer's RoPE dims "
                            "half-split instead of interleaved") for n in note), note
    with pytest.raises(RooflineError, match="indexer_types = .* starts with a shared layer"):
        _read(tmp_path, {**base, "indexer_types": ["shared"] + ["full"] * 11})


def test_what_is_not_modelled_is_refused_in_one_line(tmp_path):
    d = transformers.DeepseekV32Config(num_hidden_layers=4).to_dict()
    with pytest.raises(RooflineError, match="layer_types = .* is not modelled \\(supported: indexed_attention"):
        _read(tmp_path, {**d, "layer_types": ["full_attention"] * 4})
    with pytest.raises(RooflineError, match="q_lora_rank = null is not modelled without a q latent"):
        _read(tmp_path, {**d, "q_lora_rank": None})
    with pytest.raises(RooflineError, match="rope_interleave = false .a boolean. turns on MLA RoPE on half-split dims"):
        _read(tmp_path, {**d, "rope_interleave": False})
    # a V3.2 config relabelled deepseek_v3: DeepSeek-V3's reader still refuses the indexer
    v3 = {k: v for k, v in d.items() if k not in ("layer_types", "mlp_layer_types", "mlp_bias")}
    with pytest.raises(RooflineError, match="index_topk = 2048 turns on DeepSeek-V3.2's sparse-attention indexer "
                                            "\\(DSA: model_type deepseek_v32 reads it\\)"):
        _read(tmp_path, {**v3, "model_type": "deepseek_v3"})


@pytest.mark.parametrize("small", [True, False])
@pytest.mark.parametrize("name", ["deepseek_v32", "glm_moe_dsa", "glm_moe_dsa_shared"])
def test_parameter_counts_equal_transformers_on_the_meta_device(name, small, tmp_path):
    if small:
        c = _tiny(name.replace("_shared", ""))
    elif name == "deepseek_v32":
        c = transformers.DeepseekV32Config()
    else:
        c = transformers.GlmMoeDsaConfig(**({"index_topk_freq": 4, "index_skip_topk_offset": 3}
                                            if name.endswith("shared") else {}))
    from roofline.layer import model_params

    ours = model_params(_load(c, tmp_path))
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(c)
    assert ours == stored_params(hf)     # the routers' correction bias: a buffer there


# ---- FLOPs against FlopCounterMode

@pytest.mark.parametrize("name, seq, meta", [
    ("deepseek_v32", 40, False), ("glm_moe_dsa", 40, False), ("deepseek_v32", 12, False),
    ("deepseek_v32_shrunk", 2560, True), ("glm_moe_dsa_shrunk", 2560, True)])
def test_prefill_flops_match_flopcountermode_after_the_conventions(name, seq, meta, tmp_path):
    if name.endswith("shrunk"):       # transformers' defaults (the published sizes), two layers, the first dense
        cls = transformers.DeepseekV32Config if name.startswith("deepseek") else transformers.GlmMoeDsaConfig
        c = cls(num_hidden_layers=2, first_k_dense_replace=1,
                **({"indexer_types": ["full", "shared"]} if name.startswith("glm") else {}))
    else:
        c = _tiny(name)
    cfg = _load(c, tmp_path)
    theirs = flop_split(c, seq, meta)
    ph = W.prefill(cfg, 1, seq, act_dtype="fp32")
    kinds = {o.name: o.kind for o in model_ops(cfg)}
    ours: dict = {}
    for o in ph.ops:
        ours[kinds[o.name]] = ours.get(kinds[o.name], 0) + o.total.flops
    # the conventions: transformers scores every (query, key) pair and attends densely under a mask that keeps the
    # causal top-k; ours counts the pairs each needs (formulas.dsa.selected_pairs, exact): the indexer's causal
    # ones, the attention's min(j, topk)
    dense = seq * seq
    assert ours["index_scores"] == theirs["indexer"] * F.selected_pairs(seq) / dense
    assert ours["mla_attention"] == theirs["attention"] * F.selected_pairs(seq, 0, cfg.index_topk) / dense
    assert ours["linear"] + ours["mla_up"] == theirs["linear"]          # kv_b_proj: a GEMM over every token
    moe = len(cfg.moe_layers)
    H, I, k, E = cfg.hidden, cfg.moe_intermediate, cfg.n_active, cfg.n_experts
    # ours adds the experts' elementwise work (swiglu 5 / element, the weight multiply, the k-sum) and the router's
    rows = seq * k
    assert ours["experts"] - moe * (5 * rows * I + rows * H + seq * (k - 1) * H) == theirs["experts"]
    assert theirs["router"] == moe * 2 * seq * H * E
    assert ours["router"] == pytest.approx(theirs["router"], rel=0.1)
    mine = sum(ours[k] for k in ("linear", "mla_up", "index_scores", "mla_attention", "experts", "router"))
    converted = (theirs["linear"] + theirs["experts"] + theirs["router"]
                 + theirs["indexer"] * F.selected_pairs(seq) / dense
                 + theirs["attention"] * F.selected_pairs(seq, 0, cfg.index_topk) / dense)
    assert mine == pytest.approx(converted, rel=0.02)


# ---- explain, and the run paths

def test_explain_prints_the_capped_kv_read_beside_the_indexers(tmp_path):
    from roofline.devices import find_device
    from roofline.explain import ExplainSpec, explain_step

    spec = ExplainSpec(_load(transformers.DeepseekV32Config(), tmp_path), find_device("h100"), phase="decode",
                       batch=1, context=131_072)
    text = explain_step(spec).text()
    # 61 x 2,048 x 576 x 2 = 143,917,056 B of latents; 61 x 131,072 x 132 = 1,055,391,744 B of indexer keys
    assert ("at context 131,072: 61 MLA layers read 144 MB of KV for 2,048 selected tokens; the indexer (61 layers) "
            "reads 1.06 GB of keys over 131,072 (fp8 + an fp32 scale per 128: 132 bytes per token and layer)."
            in text)


def test_the_run_paths_take_both_families(tmp_path):
    from kernels.model import LlamaModel
    from kernels.runners import make_runners

    for name, layers in (("deepseek_v32", 3), ("glm_moe_dsa", 2)):
        m = _load(_tiny(name), tmp_path / name)
        names = [r.name for r in make_runners(m, "decode", 1, 8, dtype="fp32", backend="torch")]
        assert {"index_scores", "index_topk", "attention"} <= set(names)
        model = LlamaModel(m, dtype="fp32", backend="torch", max_len=16)
        assert model.index_cache.shape == (3, 8, 16, 16)
        assert sum("wi_q" in w for w in model.w["layers"]) == layers
