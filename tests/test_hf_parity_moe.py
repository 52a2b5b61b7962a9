"""Logits parity with transformers for mixtures of experts and latent attention (issue 21).

Tiny checkpoints built by transformers (tests/hf_tiny_moe.py: Mixtral, Qwen2-MoE with its gated shared
expert and a dense layer, Qwen3-MoE, DeepSeek-V3 with MLA, group-limited sigmoid routing, a shared
expert and a dense first layer, GPT-OSS with sinks, YaRN, clamped SwiGLU, biases and a window of 8, MiniMax-M2
with whole-projection qk-norm, partial rotary and one-group sigmoid routing with a correction bias) run
through our model on their real weights: prefill, decode past the window, chunked prefill and prefix
reuse, every logit row within 1e-4 of transformers' largest logit; the Triton kernels (fused MoE,
MLA decode) on four of them.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hf_tiny_moe as H
from kernels.model import LlamaModel
from parity import close, model, prefill_then_decode
from roofline.layer import op_names
from roofline.models import load_model


def built(model_type):
    H.require(model_type)
    return H.checkpoint(model_type), H.reference(model_type)


@pytest.mark.parametrize("model_type", H.MODEL_TYPES + H.WRAPPED)
def test_prefill_then_decode(model_type):
    prefill_then_decode(*built(model_type))


@pytest.mark.parametrize("model_type", H.MODEL_TYPES + H.WRAPPED)
def test_chunked_prefill_and_prefix_reuse(model_type):
    folder, ref = built(model_type)
    seq = torch.tensor(ref.sequence)
    n = len(seq)
    m = model(folder, n)
    for start in range(0, n - 4, 4):
        m.prefill(seq[start: start + 4], 0, logits=False)
    close(m.prefill(seq[start + 4:], 0), ref.prefill[n - 1])
    close(m.prefill_with_prefix(seq, 1, 0, n - 6), ref.prefill[n - 1])


@pytest.mark.parametrize("model_type", ["deepseek_v3", "gpt_oss", "glm4_moe", "minimax_m2", "ernie4_5_moe", "hy_v3",
                                        "deepseek_v32", "glm_moe_dsa"])
def test_triton_kernels_on_real_weights(model_type):
    """The fused MoE grouped GEMM and (DeepSeek) the absorbed MLA decode kernel, interpreted here."""
    folder, ref = built(model_type)
    seq = torch.tensor(ref.sequence)
    m = model(folder, len(seq), "triton")
    close(m.prefill(seq[:10], 0), ref.decode[9])
    close(m.decode_step(seq[10:11], [0])[0], ref.decode[10])


def test_the_readers_find_each_family():
    ds = load_model(H.checkpoint("deepseek_v3"))
    assert ds.mla and ds.dense_layers == (0,) and ds.moe_layers == H.MOE_LAYERS["deepseek_v3"]
    assert ds.router == "sigmoid_group" and ds.routed_scale == 2.5 and ds.rope_interleave is True
    assert {"q_a_proj", "kv_b_proj", "router", "experts", "shared_gate_proj", "gate_proj"} <= set(op_names(ds))
    oss = load_model(H.checkpoint("gpt_oss"))
    assert oss.attn_sinks and oss.expert_activation == "swiglu_oai" and oss.rope_yarn and oss.notes == ()
    mm = load_model(H.checkpoint("minimax_m2"))
    assert (mm.router, mm.n_group, mm.topk_group, mm.routed_scale, mm.norm_topk, mm.router_correction) == \
        ("sigmoid_group", 1, 1, 1.0, True, True)
    assert mm.qk_norm and mm.qk_norm_whole and mm.rotary_dim == 16 and mm.head_dim == 32
    assert mm.moe_layers == H.MOE_LAYERS["minimax_m2"] and mm.shared_intermediate == 0
    assert any("num_mtp_modules = 1" in n for n in mm.notes)
    q2 = load_model(H.checkpoint("qwen2_moe"))
    assert q2.moe_layers == H.MOE_LAYERS["qwen2_moe"] and q2.shared_gate and not q2.norm_topk
    er = load_model(H.checkpoint("ernie4_5_moe"))
    assert er.moe_layers == H.MOE_LAYERS["ernie4_5_moe"] and er.dense_layers == (2,) and er.shared_intermediate == 64
    assert (er.router, er.router_correction, er.norm_topk, er.rope_interleave, er.tie_embeddings) == \
        ("softmax_topk", True, True, True, True) and er.rope_theta == 500000.0 and er.notes == ()
    hy = load_model(H.checkpoint("hy_v3"))
    assert hy.moe_layers == H.MOE_LAYERS["hy_v3"] and hy.dense_layers == (1,) and hy.shared_intermediate == 32
    assert (hy.router, hy.n_group, hy.router_correction, hy.routed_scale, hy.qk_norm, hy.qkv_bias, hy.o_bias) == \
        ("sigmoid_group", 1, True, 2.826, True, True, True) and hy.rope_theta == 11158840.0 and hy.notes == ()


def test_ernie_needs_its_interleaved_rope_and_its_correction_bias():
    """Each of ERNIE's two settings moves the logits far past the tolerance when left out."""
    from dataclasses import replace
    folder, ref = built("ernie4_5_moe")
    seq = torch.tensor(ref.sequence)
    cfg = load_model(folder)
    for interleave, bias in ((False, True), (True, False)):
        m = LlamaModel(replace(cfg, rope_interleave=interleave), dtype="fp32", backend="torch", max_slots=3,
                       max_len=len(seq) + 2)
        for i in cfg.moe_layers if not bias else ():
            m.w["layers"][i]["router_correction"].zero_()
        ours = np.asarray(m.forward_full(seq[None]).detach(), dtype=np.float64).reshape(ref.prefill.shape)
        assert np.abs(ours - ref.prefill).max() / np.abs(ref.prefill).max() > 1e-2


def test_the_model_counts_each_layers_expert_load():
    folder, ref = built("qwen2_moe")
    cfg = load_model(folder)
    m = model(folder, len(ref.sequence))
    m.prefill(torch.tensor(ref.sequence[:9]), 0)
    counts = m.expert_counts
    assert counts.shape == (cfg.n_layers, cfg.n_experts)
    for i in range(cfg.n_layers):    # every routed layer saw 9 tokens x k experts; the dense layer none
        assert int(counts[i].sum()) == (9 * cfg.n_active if i in cfg.moe_layers else 0)
    from roofline import workload as W
    load = counts[cfg.moe_layers[0]].tolist()
    ph = W.decode(cfg, 4, 8, expert_load=load)
    assert 0 < ph.experts_touched <= cfg.n_experts


def test_qwen3_vl_moe_reads_its_experts_as_published_too(tmp_path):
    """The published Qwen3-VL-MoE checkpoints hold gate_up_proj [E, H, 2I] and down_proj [E, I, H]; transformers
    5.24's save_pretrained writes [E, 2I, H] / [E, H, I] (tests/hf_tiny_moe.py). Both read as transformers reads
    them: the same logits; the Triton backend's fused experts on the published layout too."""
    import shutil

    from safetensors.torch import load_file, save_file

    folder, ref = built("qwen3_vl_moe")
    published = tmp_path / "published"
    shutil.copytree(folder, published)
    tensors = load_file(folder / "model.safetensors")
    moved = {k: v.transpose(1, 2).contiguous() for k, v in tensors.items() if k.endswith(("experts.gate_up_proj",
                                                                                         "experts.down_proj"))}
    assert {tuple(v.shape) for v in moved.values()} == {(8, 64, 96), (8, 48, 64)} and len(moved) == 2 * H.LAYERS
    save_file({**tensors, **moved}, published / "model.safetensors", metadata={"format": "pt"})
    seq = torch.tensor(ref.sequence)
    for backend in ("torch", "triton"):
        m = model(published, len(seq), backend)
        close(m.prefill(seq[:10], 0), ref.decode[9])
        close(m.decode_step(seq[10:11], [0])[0], ref.decode[10])


DSA = ("deepseek_v32", "glm_moe_dsa")


@pytest.mark.parametrize("model_type", DSA)
def test_deepseek_sparse_attention_on_triton_every_phase(model_type):
    """DeepSeek-V3.2 and GLM-5 on the Triton backend (the indexer's scores kernel, the sparse MLA decode): prefill
    past index_topk, decode steps, chunked prefill and prefix reuse, each equal to transformers'."""
    folder, ref = built(model_type)
    seq = torch.tensor(ref.sequence)
    n = len(seq)
    m = model(folder, n, "triton")
    assert m.cfg.index_topk == H.INDEX_TOPK < ref.prompt + 3 < n
    close(m.prefill(seq[: ref.prompt], 0), ref.decode[ref.prompt - 1])
    for pos in range(ref.prompt, ref.prompt + 3):
        close(m.decode_step(seq[pos: pos + 1], [0])[0], ref.decode[pos])
    for start in range(0, n - 8, 8):
        m.prefill(seq[start: start + 8], 1, logits=False)
    close(m.prefill(seq[start + 8:], 1), ref.prefill[n - 1])
    close(m.prefill_with_prefix(seq, 2, 1, n - 6), ref.prefill[n - 1])


def _far(ours, theirs) -> bool:
    ours = np.asarray(ours.detach(), dtype=np.float64).reshape(theirs.shape)
    return np.abs(ours - theirs).max() / np.abs(theirs).max() > 1e-2


@pytest.mark.parametrize("model_type", DSA)
def test_deepseek_sparse_attention_needs_its_selection(model_type):
    """With index_topk at the sequence length (every key selected: dense MLA) the logits leave transformers'
    far past the tolerance, prefill and decode: the top-k selection is what the parity above checks."""
    from dataclasses import replace
    folder, ref = built(model_type)
    seq = torch.tensor(ref.sequence)
    cfg = load_model(folder)
    assert cfg.index_topk == H.INDEX_TOPK and cfg.index_n_heads == 8 and cfg.index_head_dim == 16
    assert {"index_wq_b", "index_wk", "index_k_norm", "index_scores", "index_topk"} <= set(op_names(cfg))
    dense = LlamaModel(replace(cfg, index_topk=len(seq)), dtype="fp32", backend="torch", max_slots=3,
                       max_len=len(seq) + 2)
    assert _far(dense.forward_full(seq[None]), ref.prefill)
    dense.prefill(seq[: ref.prompt], 0)
    for pos in range(ref.prompt, len(seq)):
        last = dense.decode_step(seq[pos: pos + 1], [0])[0]
    assert _far(last, ref.decode[-1])


def test_glm5_needs_its_interleaved_indexer_rope_and_its_shared_layer():
    """GLM-5's tiny checkpoint: layer 1 reuses layer 0's selection (no indexer weights of its own), its indexer's
    RoPE rotates interleaved pairs; read half-split (as DeepSeek-V3.2's) the logits leave transformers'."""
    from dataclasses import replace
    folder, ref = built("glm_moe_dsa")
    seq = torch.tensor(ref.sequence)
    cfg = load_model(folder)
    assert cfg.index_shared == (1,) and cfg.index_layers == (0, 2) and cfg.index_rope_interleave
    m = LlamaModel(cfg, dtype="fp32", backend="torch", max_slots=3, max_len=len(seq) + 2)
    assert "wi_q" in m.w["layers"][0] and "wi_q" not in m.w["layers"][1]
    half = LlamaModel(replace(cfg, index_rope_interleave=False), dtype="fp32", backend="torch", max_slots=3,
                      max_len=len(seq) + 2)
    assert _far(half.forward_full(seq[None]), ref.prefill)
