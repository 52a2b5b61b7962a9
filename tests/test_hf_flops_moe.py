"""Our prefill FLOPs against FlopCounterMode's count of transformers' own forward, for mixtures of experts and
latent attention (issue 21): tests/hf_flops_moe.py.

The published configs of tests/data/hf_configs/moe (four or five layers; meta device, batched_mm experts) at
a short prompt and one past gpt-oss's 128-token window, and the tiny real checkpoints of tests/hf_tiny_moe.py
(eager experts, real routing): linear GEMMs, routed-expert GEMMs and router GEMMs within 2%, attention within
2% after ``hf_flops.to_our_convention``. A model_type not in ``EXPECTED_TO_MATCH`` (published) /
``TINY_EXPECTED_TO_MATCH`` (tiny) that does not match (or that ours refuses) is an xfail (strict=False)
printing its ratios; add its name once it matches.

The harness itself is checked against hand-written counts that use neither it nor our formulas, and the two
ways of running it (eager on real weights, batched_mm on meta) against each other.
"""

import pytest

import hf_flops_moe as F
import hf_tiny_moe as M

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# Types that must match: published configs (meta) and tiny checkpoints (real routing) apart, since at hidden 64
# the elementwise FLOPs an op may count beside its GEMMs (activation, routing weights, softmax / top-k) are
# a few percent of it, and at published sizes a fraction of a percent.
EXPECTED_TO_MATCH: set = {"mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3", "gpt_oss", "minimax_m2"}
TINY_EXPECTED_TO_MATCH: set = {"mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3", "gpt_oss", "minimax_m2", "ernie4_5_moe",
                               "hy_v3"}
TOL = 0.02
SHORT, LONG, TINY_SEQ = 64, 512, 32       # LONG: past gpt-oss-20b's 128-token window
H, V, L = 64, 256, M.LAYERS               # the tiny configs' hidden, vocab and layers


def _compare(label: str, path, seq: int, theirs: dict, expected: set) -> None:
    model_type = theirs["model_type"]
    try:
        r = F.ratios_moe(path, seq, theirs)
        ok = all(abs(r[k] - 1) <= TOL for k in F.KINDS)
        msg = (f"{label} ({model_type}) at {seq} tokens: ours/theirs " +
               ", ".join(f"{k} {r[k]:.4f}" for k in F.KINDS) + f" (tolerance {TOL:.0%})")
    except Exception as e:      # ours refusing (RooflineError) or not knowing the type yet
        if model_type in expected:
            raise
        ok, msg = False, f"{label} ({model_type}): ours failed: {type(e).__name__}: {e}"
    if not ok and model_type not in expected:
        pytest.xfail(msg)
    assert ok, msg


@pytest.mark.parametrize("name", sorted(F.REAL))
def test_published_config_flops_match_transformers(name):
    path = F.REAL[name]
    for seq in (SHORT, LONG):
        theirs = F.hf_flop_split_moe(path, seq)
        assert theirs["implementation"] == "batched_mm" and theirs["other"] == 0 and theirs["experts"] > 0
        _compare(name, path, seq, theirs, EXPECTED_TO_MATCH)


@pytest.mark.parametrize("model_type", M.MODEL_TYPES)
def test_tiny_checkpoint_flops_match_transformers(model_type):
    M.require(model_type)
    path = M.checkpoint(model_type)
    theirs = F.hf_flop_split_moe(path, TINY_SEQ)
    assert theirs["implementation"] == "eager" and theirs["other"] == 0
    _compare(f"tiny {model_type}", path, TINY_SEQ, theirs, TINY_EXPECTED_TO_MATCH)


# ---- the harness itself

@pytest.fixture(scope="module")
def bare_configs(tmp_path_factory):
    """The tiny configs' config.json alone (no weights: the meta path), one folder per model_type."""
    root = tmp_path_factory.mktemp("hf-tiny-moe-configs")
    out = {}
    for mt in M.MODEL_TYPES:
        M.require(mt)
        M.tiny_config(mt).save_pretrained(root / mt)
        out[mt] = root / mt / "config.json"
    return out


# (experts E, top-k, expert intermediate I) of each tiny config: written out, not read back from it
TINY_MOE = {"mixtral": (8, 2, 32), "qwen2_moe": (8, 4, 32), "qwen3_moe": (8, 2, 32), "deepseek_v3": (8, 3, 32),
            "gpt_oss": (4, 2, 32), "glm4_moe": (8, 3, 32), "minimax_m2": (8, 3, 32), "ernie4_5_moe": (8, 3, 32),
            "hy_v3": (8, 3, 32), "deepseek_v32": (8, 3, 32), "glm_moe_dsa": (8, 3, 32)}


@pytest.mark.parametrize("model_type", M.MODEL_TYPES)
def test_eager_experts_count_only_routed_work_and_equal_batched_mm_on_meta(model_type, bare_configs):
    """transformers' eager MoE loops over the experts that received tokens, each multiplying its own tokens:
    FlopCounterMode counts k experts per token (not E), and the meta path (batched_mm) counts the same."""
    S, (E, k, I) = TINY_SEQ, TINY_MOE[model_type]
    real = F.hf_flop_split_moe(M.checkpoint(model_type), S)
    meta = F.hf_flop_split_moe(bare_configs[model_type], S)
    assert (real["implementation"], meta["implementation"]) == ("eager", "batched_mm")
    assert real["moe_layers"] == meta["moe_layers"] == M.MOE_LAYERS[model_type]
    per_token = 2 * H * 2 * I + 2 * I * H                        # gate+up, then down: one expert, one token
    assert real["experts_layers"] == (S * k * per_token,) * len(M.MOE_LAYERS[model_type])
    for counts in real["expert_tokens"]:                      # the histogram the loop ran over
        assert sum(counts) == S * k and len(counts) == E
        assert sum(c > 0 for c in counts) >= min(E, 4)        # several experts ran
    assert real["experts"] < S * E * per_token * len(real["moe_layers"])   # not every expert on every token
    for key in ("linear", "experts", "router", "shared_gate", "attention", "total", "attention_layers"):
        assert real[key] == meta[key], key
    assert meta["expert_tokens"] is None


def test_split_of_the_tiny_mixtral_is_exact():
    S, E, k, I, Hq, Hkv, D = TINY_SEQ, 8, 2, 32, 4, 2, 16
    s = F.hf_flop_split_moe(M.checkpoint("mixtral"), S)
    attn_proj = 2 * S * H * (Hq * D + 2 * Hkv * D) + 2 * S * Hq * D * H
    assert s["linear"] == L * attn_proj + 2 * 1 * H * V          # lm_head: the last position only
    assert s["experts"] == L * 2 * S * k * 3 * H * I
    assert s["router"] == L * 2 * S * H * E and s["shared_gate"] == 0
    assert s["attention_layers"] == (4 * Hq * S * S * D,) * L
    assert s["other"] == 0 and s["total"] == s["linear"] + s["experts"] + s["router"] + s["attention"]
    assert s["windows"] == (0, 0, 0)


def test_split_of_the_tiny_qwen2_moe_has_its_dense_layer_and_shared_expert_gate():
    S, E, k, I, Is, Id, D = TINY_SEQ, 8, 4, 32, 48, 96, 16
    s = F.hf_flop_split_moe(M.checkpoint("qwen2_moe"), S)
    attn_proj = 2 * S * H * (4 * D + 2 * 2 * D) + 2 * S * 4 * D * H
    dense_mlp, shared = 3 * 2 * S * H * Id, 3 * 2 * S * H * Is   # layer 1 dense; a shared expert in 0 and 2
    assert s["moe_layers"] == (0, 2)
    assert s["linear"] == L * attn_proj + dense_mlp + 2 * shared + 2 * H * V
    assert s["shared_gate"] == 2 * 2 * S * H                     # hidden -> 1, in layers 0 and 2
    assert s["router"] == 2 * 2 * S * H * E + s["shared_gate"]
    assert s["experts"] == 2 * 2 * S * k * 3 * H * I


def test_split_of_the_tiny_deepseek_v3_counts_mla_as_transformers_runs_it():
    S, E, k, I, Id, Hq = TINY_SEQ, 8, 3, 32, 96, 4
    qr, kvr, nope, rope, v = 48, 32, 16, 8, 24
    s = F.hf_flop_split_moe(M.checkpoint("deepseek_v3"), S)
    mla = 2 * S * (H * qr + qr * Hq * (nope + rope) + H * (kvr + rope) + kvr * Hq * (nope + v) + Hq * v * H)
    assert s["moe_layers"] == (1, 2)                            # first_k_dense_replace 1
    assert s["linear"] == L * mla + 3 * 2 * S * H * Id + 2 * 3 * 2 * S * H * I + 2 * H * V   # + 2 shared experts
    assert s["router"] == 2 * 2 * S * H * E
    assert s["experts"] == 2 * 2 * S * k * 3 * H * I
    assert s["attention_layers"] == (2 * Hq * S * S * (nope + rope) + 2 * Hq * S * S * v,) * L


def test_published_configs_as_transformers_reads_them():
    ds = F.hf_flop_split_moe(F.REAL["deepseek-v3"], SHORT)
    assert ds["moe_layers"] == (3, 4) and ds["windows"] == (0,) * 5
    go = F.hf_flop_split_moe(F.REAL["gpt-oss-20b"], SHORT)
    assert go["windows"] == (128, 0, 128, 0) and go["moe_layers"] == (0, 1, 2, 3)
    # gpt-oss-20b: 32 experts of 2880, top-4, hidden 2880
    assert go["experts"] == 4 * 2 * SHORT * 4 * 3 * 2880 * 2880
    mx = F.hf_flop_split_moe(F.REAL["mixtral-8x7b-v0.1"], SHORT)    # 8 x 14336, top-2, hidden 4096
    assert mx["experts"] == 4 * 2 * SHORT * 2 * 3 * 4096 * 14336 and mx["router"] == 4 * 2 * SHORT * 4096 * 8
    q = F.hf_flop_split_moe(F.REAL["qwen1.5-moe-a2.7b"], SHORT)     # 60 x 1408, top-4; shared 5632 gated
    assert q["experts"] == 4 * 2 * SHORT * 4 * 3 * 2048 * 1408 and q["shared_gate"] == 4 * 2 * SHORT * 2048
    assert F.hf_flop_split_moe(F.REAL["qwen3-30b-a3b"], SHORT)["experts"] == 4 * 2 * SHORT * 8 * 3 * 2048 * 768


def test_kind_buckets():
    assert [F.kind_bucket(k) for k in ("linear", "experts", "router", "attention", "mla_attention", "mla_up",
                                       "gate", "norm", "latent_append", "rope", "activation")] == \
        ["linear", "experts", "router", "attention", "attention", "linear", "router", "other", "other", "other",
         "other"]
