"""The tiny MoE / MLA checkpoints of tests/hf_tiny_moe.py (issue 21): they build, their reference decode equals
their full forward at every position, their routing spreads tokens over several experts far from any tie, and
the features they exist to exercise (DeepSeek's correction bias, GPT-OSS's clamp) change what they compute."""

import json

import numpy as np
import pytest

import hf_tiny_moe as M

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors import safe_open  # noqa: E402

# (experts, top-k) written out, not read back from the fixture
ROUTED = {"mixtral": (8, 2), "qwen2_moe": (8, 4), "qwen3_moe": (8, 2), "deepseek_v3": (8, 3), "gpt_oss": (4, 2),
          "glm4_moe": (8, 3), "minimax_m2": (8, 3), "ernie4_5_moe": (8, 3), "hy_v3": (8, 3),
          "deepseek_v32": (8, 3), "glm_moe_dsa": (8, 3)}


def _config(model_type) -> dict:
    return json.loads((M.checkpoint(model_type) / "config.json").read_text())


def _rel(a, b) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("model_type", M.MODEL_TYPES)
def test_checkpoint_is_a_float32_safetensors_folder_of_that_type(model_type):
    M.require(model_type)
    cfg = _config(model_type)
    assert cfg["model_type"] == model_type and cfg["transformers_version"] == M.version()
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]) == (3, 64, 256)
    assert cfg.get("quantization_config") is None
    with safe_open(str(M.checkpoint(model_type) / "model.safetensors"), "pt") as f:
        dtypes = {f.get_tensor(k).dtype for k in f.keys()}
        assert f.get_tensor("model.embed_tokens.weight").shape == (256, 64)
    assert dtypes == {torch.float32}


def test_configs_carry_each_familys_features():
    q2, q3, ds, go = (_config(t) for t in ("qwen2_moe", "qwen3_moe", "deepseek_v3", "gpt_oss"))
    assert (q2["norm_topk_prob"], q2["mlp_only_layers"], q2["shared_expert_intermediate_size"]) == (False, [1], 48)
    assert (q3["norm_topk_prob"], q3["head_dim"]) == (True, 32)
    assert (ds["q_lora_rank"], ds["kv_lora_rank"], ds["qk_rope_head_dim"], ds["qk_nope_head_dim"],
            ds["v_head_dim"], ds["first_k_dense_replace"], ds["n_group"], ds["topk_group"],
            ds["n_shared_experts"], ds["routed_scaling_factor"]) == (48, 32, 8, 16, 24, 1, 4, 2, 1, 2.5)
    assert ds["rope_interleave"] is M.ROPE_INTERLEAVE is transformers.DeepseekV3Config().rope_interleave
    assert ds["rope_parameters"]["rope_type"] == "default"
    assert (go["sliding_window"], go["layer_types"], go["swiglu_limit"]) == \
        (8, ["sliding_attention", "full_attention", "sliding_attention"], 7.0)
    assert M.BUILT_WITH == "5.24.0"


@pytest.mark.parametrize("model_type", M.MODEL_TYPES)
def test_reference_decode_equals_full_forward_at_every_position(model_type):
    M.require(model_type)
    r = M.reference(model_type)
    assert len(r.sequence) == M.TOKENS and r.prompt == M.PROMPT and M.TOKENS > 2 * M.WINDOW
    assert r.prefill.shape == r.decode.shape == (M.TOKENS, 256)
    assert 0.3 < r.prefill.std() < 3.0
    for pos in range(M.TOKENS):
        assert _rel(r.decode[pos], r.prefill[pos]) < 1e-5, pos
    for pos in range(M.TOKENS - 6, M.TOKENS):                   # the greedy tail
        assert r.sequence[pos] == int(np.argmax(r.decode[pos - 1]))


@pytest.mark.parametrize("model_type", M.MODEL_TYPES)
def test_routing_spreads_tokens_over_experts_far_from_ties(model_type):
    M.require(model_type)
    E, k = ROUTED[model_type]
    seq = M.reference(model_type).sequence
    T = len(seq)
    layers = M.routing(M.checkpoint(model_type), seq)
    assert tuple(r.layer for r in layers) == M.MOE_LAYERS[model_type]
    for r in layers:
        assert r.experts.shape == (T, k) and r.counts.sum() == T * k and r.logits.shape == (T, E)
        assert (r.counts > 0).sum() >= min(E, 4), r.counts            # several experts used
        assert r.counts.max() < T, r.counts                             # none takes every token
        assert len({tuple(sorted(row)) for row in r.experts.tolist()}) >= 3   # tokens choose differently
        assert r.margin > 1e-4, r.margin                                # no near-ties: fp32 noise cannot flip
    sums = np.concatenate([r.weights.sum(axis=1) for r in layers])
    if model_type == "qwen2_moe":            # norm_topk_prob false: a share of 1, ~4% short on average
        assert 0.5 < sums.min() and sums.max() < 1 - 1e-4 and sums.mean() < 0.98
    else:                                                               # renormalised; DeepSeek x 2.5, Hy3 x 2.826
        scale = {"deepseek_v3": 2.5, "deepseek_v32": 2.5, "glm_moe_dsa": 2.5, "glm4_moe": 2.5, "hy_v3": 2.826}.get(model_type, 1.0)
        np.testing.assert_allclose(sums, scale, rtol=1e-5)


def test_deepseek_correction_bias_changes_some_choices_but_not_the_weights():
    ds = M.routing(M.checkpoint("deepseek_v3"), M.reference("deepseek_v3").sequence)
    changed = 0
    for r in ds:
        s = torch.sigmoid(torch.tensor(r.logits, dtype=torch.float64))
        groups = s.view(-1, 4, 2).sum(-1)                               # top-2 of a 2-expert group: both
        keep = torch.zeros_like(groups, dtype=torch.bool).scatter_(1, groups.topk(2, dim=-1).indices, True)
        plain = s.masked_fill(~keep.repeat_interleave(2, dim=1), -1.0).topk(3, dim=-1).indices
        changed += sum(set(a) != set(b) for a, b in zip(plain.tolist(), r.experts.tolist()))
        w = s.gather(1, torch.tensor(r.experts))                        # the weights: plain sigmoid scores
        np.testing.assert_allclose(r.weights, (w / w.sum(1, keepdim=True) * 2.5).numpy(), rtol=1e-5)
    assert changed >= 2                                                 # the bias matters for the fixture


def test_minimax_correction_bias_changes_some_choices_but_not_the_weights_and_its_qk_norm_is_whole():
    folder = M.checkpoint("minimax_m2")
    layers = M.routing(folder, M.reference("minimax_m2").sequence)
    changed = 0
    for r in layers:
        s = torch.sigmoid(torch.tensor(r.logits, dtype=torch.float64))
        plain = s.topk(3, dim=-1).indices                               # one group: the top-3 of all 8
        changed += sum(set(a) != set(b) for a, b in zip(plain.tolist(), r.experts.tolist()))
        w = s.gather(1, torch.tensor(r.experts))                        # weighed by the un-biased scores
        np.testing.assert_allclose(r.weights, (w / w.sum(1, keepdim=True)).numpy(), rtol=1e-5)
    assert changed >= 2
    with safe_open(str(folder / "model.safetensors"), "pt") as f:       # one norm over 4 heads x 32, 2 x 32
        assert f.get_tensor("model.layers.0.self_attn.q_norm.weight").shape == (128,)
        assert f.get_tensor("model.layers.0.self_attn.k_norm.weight").shape == (64,)
        assert f.get_tensor("model.layers.2.block_sparse_moe.e_score_correction_bias").abs().min() > 0


def test_ernie_correction_bias_changes_some_choices_but_not_the_weights():
    """ERNIE chooses by softmax + moe_statics.e_score_correction_bias and weighs by the softmax alone."""
    folder = M.checkpoint("ernie4_5_moe")
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        assert f.get_tensor("model.layers.0.mlp.moe_statics.e_score_correction_bias").shape == (1, 8)
    changed = 0
    for r in M.routing(folder, M.reference("ernie4_5_moe").sequence):
        p = torch.softmax(torch.tensor(r.logits, dtype=torch.float64), dim=-1)
        plain = p.topk(3, dim=-1).indices
        changed += sum(set(a) != set(b) for a, b in zip(plain.tolist(), r.experts.tolist()))
        w = p.gather(1, torch.tensor(r.experts))
        np.testing.assert_allclose(r.weights, (w / w.sum(1, keepdim=True)).numpy(), rtol=1e-5)
    assert changed >= 2


def test_hy_v3_correction_bias_changes_some_choices_but_not_the_weights():
    """Hy3 chooses by sigmoid + the MoE block's bias (saved as mlp.expert_bias) and weighs by the sigmoid alone."""
    folder = M.checkpoint("hy_v3")
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        bias = f.get_tensor("model.layers.0.mlp.expert_bias")
    assert bias.shape == (8,) and float(bias.abs().min()) > 0
    changed = 0
    for r in M.routing(folder, M.reference("hy_v3").sequence):
        s = torch.sigmoid(torch.tensor(r.logits, dtype=torch.float64))
        changed += sum(set(a) != set(b) for a, b in zip(s.topk(3, dim=-1).indices.tolist(), r.experts.tolist()))
        w = s.gather(1, torch.tensor(r.experts))
        np.testing.assert_allclose(r.weights, (w / w.sum(1, keepdim=True) * 2.826).numpy(), rtol=1e-5)
    assert changed >= 2


def test_gpt_oss_swiglu_clamp_bites():
    folder, r = M.checkpoint("gpt_oss"), M.reference("gpt_oss")
    with M.one_thread(), torch.no_grad():
        loose = transformers.AutoModelForCausalLM.from_pretrained(
            folder, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager",
            swiglu_limit=1e9).eval()
        logits = loose(input_ids=torch.tensor([list(r.sequence)])).logits[0].numpy()
    assert _rel(logits, r.prefill) > 1e-2


@pytest.mark.parametrize("model_type", ["deepseek_v32", "glm_moe_dsa"])
def test_the_indexers_select_far_from_ties(model_type):
    """Every indexer layer (GLM-5's tiny: 2 of 3, layer 1 shared) chooses its top-k with a gap above fp32 noise
    (seen: 3.4e-4 and 5.4e-5 the smallest), and some queries see more keys than index_topk."""
    M.require(model_type)
    margins = M.index_margins(M.checkpoint(model_type), M.reference(model_type).sequence)
    assert len(margins) == {"deepseek_v32": 3, "glm_moe_dsa": 2}[model_type]
    assert min(margins) > 1e-5, margins
