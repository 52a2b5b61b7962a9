"""The tiny transformers checkpoints of tests/hf_tiny.py: they build, their reference decode equals their
reference full forward at every position (past the window too), and each family feature they are meant to
exercise changes the logits (so a model that ignores it cannot pass a parity test against them)."""

import json
import shutil

import numpy as np
import pytest

import hf_tiny as H

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors = pytest.importorskip("safetensors")
from safetensors import safe_open  # noqa: E402

WINDOWED = ("mistral", "qwen2", "phi3", "gemma2", "gemma3_text")


def _tensors(model_type) -> dict:
    with safe_open(str(H.checkpoint(model_type) / "model.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def _config(model_type) -> dict:
    return json.loads((H.checkpoint(model_type) / "config.json").read_text())


def _rel(a, b) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("model_type", H.MODEL_TYPES)
def test_checkpoint_is_a_safetensors_folder_of_that_type(model_type):
    H.require(model_type)
    cfg = _config(model_type)
    assert cfg["model_type"] == model_type
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"],
            cfg["num_key_value_heads"], cfg["vocab_size"]) == (3, 64, 4, 2, 256)
    t = _tensors(model_type)
    assert all(v.dtype == torch.float32 for v in t.values())
    assert t["model.embed_tokens.weight"].shape == (256, 64)


@pytest.mark.parametrize("model_type", H.MODEL_TYPES)
def test_reference_decode_equals_full_forward_at_every_position(model_type):
    H.require(model_type)
    r = H.reference(model_type)
    assert len(r.sequence) == H.TOKENS and r.prompt == H.PROMPT and H.TOKENS > 2 * H.WINDOW
    assert r.prefill.shape == r.decode.shape == (H.TOKENS, 256)
    assert 0.3 < r.prefill.std() < 3.0                  # O(1) logits: softmax neither flat nor one-hot
    for pos in range(H.TOKENS):
        assert _rel(r.decode[pos], r.prefill[pos]) < 1e-5, pos
    # the greedy tail: each generated token is the argmax of the previous position's logits
    given = H.TOKENS - 6
    for pos in range(given, H.TOKENS):
        assert r.sequence[pos] == int(np.argmax(r.decode[pos - 1]))


def test_weights_are_seeded_and_differ_between_seeds(tmp_path):
    H.require("llama")
    a = H.build_checkpoint("llama", tmp_path / "a", seed=0)
    b = H.build_checkpoint("llama", tmp_path / "b", seed=1)
    with safe_open(str(a / "model.safetensors"), "pt") as fa, safe_open(str(b / "model.safetensors"), "pt") as fb:
        wa, wb = fa.get_tensor("lm_head.weight"), fb.get_tensor("lm_head.weight")
    assert torch.equal(wa, _tensors("llama")["lm_head.weight"])      # seed 0 again: the same weights
    assert not torch.equal(wa, wb)
    assert abs(float(wa.std()) - H.LINEAR_STD) < 0.01


@pytest.mark.parametrize("model_type", H.MODEL_TYPES)
def test_norm_weights_are_far_from_trivial(model_type):
    H.require(model_type)
    norms = [v for k, v in _tensors(model_type).items() if "norm" in k]
    allv = torch.cat([v.flatten() for v in norms])
    base = 0.0 if model_type in H.GEMMA_FAMILY else 1.0        # Gemma stores w of (1 + w)
    assert abs(float(allv.mean()) - base) < 0.1
    assert float(allv.std()) > 0.15


def test_family_layouts():
    H.require("gemma")
    llama, gemma, phi3, qwen2, qwen3 = (_tensors(m) for m in ("llama", "gemma", "phi3", "qwen2", "qwen3"))
    assert "lm_head.weight" not in gemma and _config("gemma")["tie_word_embeddings"] is True   # tied
    assert not torch.equal(llama["lm_head.weight"], llama["model.embed_tokens.weight"])       # untied
    assert phi3["model.layers.0.self_attn.qkv_proj.weight"].shape == ((4 + 2 + 2) * 16, 64)
    assert phi3["model.layers.0.mlp.gate_up_proj.weight"].shape == (2 * 96, 64)
    assert {k.split(".")[-2] for k in qwen2 if k.endswith("bias")} == {"q_proj", "k_proj", "v_proj"}
    assert float(qwen2["model.layers.0.self_attn.q_proj.bias"].std()) > 0.2
    assert qwen3["model.layers.0.self_attn.q_norm.weight"].shape == (32,)                      # head_dim 32
    assert qwen3["model.layers.0.self_attn.q_proj.weight"].shape == (4 * 32, 64)


def _edited_logits(model_type, tmp_path, edit) -> np.ndarray:
    """transformers' full-forward logits of the checkpoint with ``edit(config dict)`` applied to config.json."""
    folder = tmp_path / model_type
    shutil.copytree(H.checkpoint(model_type), folder)
    d = json.loads((folder / "config.json").read_text())
    edit(d)
    (folder / "config.json").write_text(json.dumps(d))
    return H.prefill_logits(folder, H.reference(model_type).sequence)


def _all_full(d):
    d["layer_types"] = ["full_attention"] * d["num_hidden_layers"]
    if "use_sliding_window" in d:
        d["use_sliding_window"] = False


def _no_window(d):
    d["sliding_window"] = None


def _wide_window(d):
    """The window wider than every position: the sliding layers see every key (their RoPE stays theirs)."""
    d["sliding_window"] = 1000


def _same_rope_base(d):
    rp = d.get("rope_parameters")
    if isinstance(rp, dict) and "sliding_attention" in rp:        # 5.x: a RoPE per layer type
        rp["sliding_attention"] = dict(rp["full_attention"])
    else:                                                          # 4.x
        d["rope_local_base_freq"] = d["rope_theta"]


def _set(**kw):
    return lambda d: d.update(kw)


FEATURES = [  # (model_type, feature, config edit that removes it, whether only positions past the window move)
    ("mistral", "sliding_window", _no_window, True),
    ("phi3", "sliding_window", _no_window, True),
    ("qwen2", "max_window_layers", _all_full, True),
    ("gemma2", "alternating window", _all_full, True),
    ("gemma3_text", "sliding window", _wide_window, True),
    ("gemma2", "attn softcap", _set(attn_logit_softcapping=None), False),
    ("gemma2", "final softcap", _set(final_logit_softcapping=None), False),
    ("gemma2", "query_pre_attn_scalar", _set(query_pre_attn_scalar=32), False),
    ("gemma3_text", "rope_local_base_freq", _same_rope_base, False),
    ("smollm3", "no_rope_layers", _set(no_rope_layers=[1, 1, 1]), False),
    ("phi3", "partial_rotary_factor", lambda d: d["rope_parameters"].update(partial_rotary_factor=1.0), False),
    ("granite", "embedding_multiplier", _set(embedding_multiplier=1.0), False),
    ("granite", "residual_multiplier", _set(residual_multiplier=1.0), False),
    ("granite", "attention_multiplier", _set(attention_multiplier=1.0), False),
    ("granite", "logits_scaling", _set(logits_scaling=1.0), False),
    ("olmo3", "sliding window", _wide_window, True),
    ("olmo3", "the full layers' YaRN", lambda d: d["rope_parameters"].update(
        full_attention={"rope_type": "default", "rope_theta": 500000.0}), False),
    ("exaone4", "sliding window", _wide_window, True),
    ("exaone4", "the global layers' NoPE", lambda d: (_no_window(d), _all_full(d)), False),   # all rotate
]


@pytest.mark.parametrize("model_type,feature,edit,windowed", FEATURES,
                         ids=[f"{m}-{f}" for m, f, _, _ in FEATURES])
def test_each_feature_changes_the_logits(model_type, feature, edit, windowed, tmp_path):
    H.require(model_type)
    ref = H.reference(model_type).prefill
    got = _edited_logits(model_type, tmp_path, edit)
    assert _rel(got, ref) > 1e-3, feature                          # removing it moves the logits
    if windowed:                                   # ... only where a query has more keys than the window
        assert _rel(got[: H.WINDOW], ref[: H.WINDOW]) < 1e-5
        assert _rel(got[H.WINDOW:], ref[H.WINDOW:]) > 1e-3
