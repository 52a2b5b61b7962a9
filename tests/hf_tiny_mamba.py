"""Tiny real Mamba-2 hybrid checkpoints built with transformers' own code, and transformers' own logits for them
(issue 32). The same API as tests/hf_tiny_moe.py, whose builder, references and weight draws this reuses.

For each ``model_type`` of ``MODEL_TYPES`` a float32 config, hidden 64, vocab 256, the Mamba-2 mixer at 4 heads of 8
or 16 channels, d_state 8, 2 groups of B and C, a conv of 4 taps with its bias, a scan chunk of 16 (prompts past it
cross a chunk boundary), in_proj and out_proj with biases:

- nemotron_h: blocks M, E, *, - (``layers_block_type``): a Mamba-2 mixer alone; routed relu2 experts (8 of 32, top-2,
  DeepSeek's sigmoid routing with a correction bias, x 2.5) beside a relu2 shared expert of 48; attention alone (no
  RoPE, head_dim 16); a relu2 MLP of 96 alone. Every block one norm (layer_norm_epsilon 1e-5) and its residual;
  time_step_min 0.001 clamps the prefill scan's dt.
- granitemoehybrid: Mamba-2, attention (RoPE), Mamba-2 mixers (``layer_types``), each layer with routed SwiGLU
  experts (4 of 32, top-2, softmax over the top-2 logits) beside the shared MLP of 48; Granite's four multipliers
  (embedding 12, residual 0.22, attention 0.1 in place of 1/sqrt(head_dim), logits / 2.5); time_step_limit
  (0.2, 1.5) clamps the prefill scan's dt on both sides, and bites: transformers' cached decode step clamps nothing,
  so its logits after a cached prefill differ from one full forward's by some 4% of the largest (``reference``'s
  decode and prefill rows are each compared with ours on the same path).
- granitemoehybrid_dense (a variant of it, not a model_type): no experts, so the shared MLP (48) is the whole MLP;
  attention on layer 0 without RoPE, Mamba-2 on 1 and 2; dt unclamped.
- falcon_h1: 2 layers, each attention (RoPE, head_dim 16, biases) and Mamba-2 (mamba_d_ssm 32) side by side on the
  same normed input, summed, then a SwiGLU MLP of 96; y x silu(z) (no gated norm: mamba_rms_norm false); every muP
  multiplier away from 1 (``_FALCON``: the embedding's, lm_head's, attention's in / key / out, the SSM's in / out and
  its five in_proj outputs', the MLP's gate and down).
- falcon_h1_norm: the same with mamba_rms_norm (norm before gate: each group's RMSNorm, then x silu(z)) and
  time_step_limit (0.2, 1.5).

``build_checkpoint`` saves it with hf_tiny_moe's seeded draw (2-D weights N(0, 0.1), 1-D ones (A_log, D, dt_bias,
biases) N(0, 0.3), norm weights U(0.6, 1.4), decisive routers); ``reference`` / ``prefill_logits`` / ``checkpoint``
are hf_tiny_moe's (eager attention, eager experts, transformers' torch path of the mixer: no mamba_ssm or
causal_conv1d kernels are installed here).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import hf_tiny as H
import hf_tiny_moe as HM
from hf_tiny import PROMPT, TOKENS, one_thread, tokens, version  # noqa: F401  (re-exported API)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

BUILT_WITH = "5.24.0"
# the tiny models (a "_" variant is its model_type's config with other settings)
MODEL_TYPES = ("nemotron_h", "granitemoehybrid", "granitemoehybrid_dense", "falcon_h1", "falcon_h1_norm")

_COMMON = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
               max_position_embeddings=256, initializer_range=0.02, use_cache=True, pad_token_id=0, bos_token_id=1,
               eos_token_id=2, tie_word_embeddings=False)
_MAMBA = dict(mamba_n_heads=4, mamba_d_state=8, mamba_n_groups=2, mamba_d_conv=4, mamba_chunk_size=16,
              mamba_conv_bias=True, mamba_proj_bias=True)

# Falcon-H1: every muP multiplier away from 1, biases on attention and both Mamba projections, RoPE on every dim
_FALCON = dict(head_dim=16, intermediate_size=96, mamba_d_ssm=32, attention_bias=True, projectors_bias=True,
               rope_theta=10000.0, rms_norm_eps=1e-6, embedding_multiplier=2.0, lm_head_multiplier=0.5,
               key_multiplier=0.7, attention_in_multiplier=1.3, attention_out_multiplier=0.8, ssm_in_multiplier=1.2,
               ssm_out_multiplier=0.9, ssm_multipliers=[1.1, 0.9, 1.2, 0.8, 1.3], mlp_multipliers=[1.4, 0.6],
               **_MAMBA)

_CONFIGS = {
    "nemotron_h": ("NemotronHConfig", dict(
        head_dim=16, intermediate_size=96, layers_block_type=["linear_attention", "moe", "full_attention", "mlp"],
        mamba_num_heads=4, mamba_head_dim=8, ssm_state_size=8, n_groups=2, conv_kernel=4, chunk_size=16,
        use_conv_bias=True, use_bias=True, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
        moe_shared_expert_intermediate_size=48, routed_scaling_factor=2.5, n_group=1, topk_group=1,
        norm_topk_prob=True, layer_norm_epsilon=1e-5, time_step_min=0.001)),
    "granitemoehybrid": ("GraniteMoeHybridConfig", dict(
        num_hidden_layers=3, intermediate_size=32, shared_intermediate_size=48, num_local_experts=4,
        num_experts_per_tok=2, layer_types=["mamba", "attention", "mamba"], position_embedding_type="rope",
        mamba_expand=1, embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.1,
        logits_scaling=2.5, rms_norm_eps=1e-6, time_step_limit=(0.2, 1.5), **_MAMBA)),
    # the same without experts: the shared MLP is the whole MLP (its input_linear halves as gate_proj / up_proj),
    # attention without RoPE (position_embedding_type none), dt unclamped (time_step_limit's default)
    "granitemoehybrid_dense": ("GraniteMoeHybridConfig", dict(
        num_hidden_layers=3, intermediate_size=32, shared_intermediate_size=48, num_local_experts=0,
        layer_types=["attention", "mamba", "mamba"], mamba_expand=1, embedding_multiplier=12.0,
        residual_multiplier=0.22, attention_multiplier=0.1, logits_scaling=2.5, rms_norm_eps=1e-6, **_MAMBA)),
    "falcon_h1": ("FalconH1Config", dict(num_hidden_layers=2, **_FALCON)),
    # the same with the gated RMSNorm in Falcon-H1's order (each group's norm, then x silu(z)) and a dt clamp
    "falcon_h1_norm": ("FalconH1Config", dict(num_hidden_layers=2, mamba_rms_norm=True, mamba_norm_before_gate=True,
                                              time_step_limit=(0.2, 1.5), **_FALCON)),
}
# what a reader of these configs must find
LAYERS = {"nemotron_h": dict(mamba=(0,), attention=(2,), moe=(1,), no_mlp=(0, 2), head_dim=8),
          "granitemoehybrid": dict(mamba=(0, 2), attention=(1,), moe=(0, 1, 2), no_mlp=(), head_dim=16),
          "granitemoehybrid_dense": dict(mamba=(1, 2), attention=(0,), moe=(), no_mlp=(), head_dim=16),
          "falcon_h1": dict(mamba=(0, 1), attention=(0, 1), moe=(), no_mlp=(), head_dim=8),
          "falcon_h1_norm": dict(mamba=(0, 1), attention=(0, 1), moe=(), no_mlp=(), head_dim=8)}


def require(model_type: str) -> None:
    """Skip the calling test when the installed transformers cannot build ``model_type`` as written here."""
    if model_type not in _CONFIGS:
        raise ValueError(f"model_type {model_type!r} has no tiny Mamba-2 config: known are {', '.join(MODEL_TYPES)}")
    cls_name = _CONFIGS[model_type][0]
    if not hasattr(transformers, cls_name):
        pytest.skip(f"transformers {version()} has no {cls_name}: the {model_type} fixture needs a newer one")
    if H._major_minor(version()) < (5, 0):
        pytest.skip(f"transformers {version()}: the tiny Mamba-2 fixtures are written for 5.x; built with {BUILT_WITH}")


def tiny_config(model_type: str):
    require(model_type)
    cls_name, extra = _CONFIGS[model_type]
    cfg = getattr(transformers, cls_name)(**{**_COMMON, **extra})
    setattr(cfg, H._DTYPE(), torch.float32)
    return cfg


def build_checkpoint(model_type: str, folder, seed: int = 0) -> Path:
    """Save a tiny ``model_type`` checkpoint in ``folder`` (config.json + model.safetensors, float32) with
    hf_tiny_moe's weights drawn from ``seed``; returns the folder."""
    cfg = tiny_config(model_type)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with one_thread(), torch.no_grad():
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager",
                                                              experts_implementation="eager").float().eval()
        HM._randomize(model, model_type, seed)
        model.save_pretrained(folder, safe_serialization=True)
    if not (folder / "model.safetensors").exists():
        raise RuntimeError(f"save_pretrained wrote no model.safetensors in {folder}: {sorted(folder.iterdir())}")
    return folder


reference_logits, prefill_logits = HM.reference_logits, HM.prefill_logits
_FIXTURES = H.SessionFixtures(build_checkpoint, reference_logits, "roofline-hf-tiny-mamba-")
checkpoint, reference = _FIXTURES.checkpoint, _FIXTURES.reference
