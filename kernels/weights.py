"""The model's weights drawn at random from a seed, in the layout every consumer reads (``init_weights``): one
tensor per ``roofline.layer`` WeightSpec, per layer the specs that layer reads (``layer_weights``). Real
weights in the same layout come from ``kernels.checkpoint``."""

from __future__ import annotations

import math

import torch

from roofline.layer import model_ops
from roofline.models import ModelConfig


def seeded_generator(device, seed: int):
    """A seeded torch.Generator on ``device``; None on the meta device (no values, only shapes)."""
    if torch.device(device).type == "meta":
        return None
    return torch.Generator(device=device).manual_seed(seed)


def init_weights(cfg: ModelConfig, dtype: torch.dtype, device, seed: int = 0) -> dict:
    """Random weights for every WeightSpec of ``cfg``'s ops (``roofline.layer``), drawn in op order:
    linear [in, out] ~ N(0, 1/in) (activations stay O(1)); norms ~ 1 + N(0, 0.1) (the multiplier the model
    applies: for (1 + w) norms, 1 + w); biases ~ N(0, 0.1); the embedding ~ N(0, 1).
    Layout: {"embed", "final_norm", "lm_head" (embed.t() when tied), "layers": [{key: tensor}]}."""
    g = seeded_generator(device, seed)

    def rnd(*shape, std=1.0, mean=0.0):
        if g is None:                                    # meta: shapes only
            return torch.empty(*shape, device=device, dtype=dtype)
        return (torch.randn(*shape, generator=g, device=device, dtype=torch.float32) * std + mean).to(dtype)

    def make(ws):
        if ws.role == "linear":
            return rnd(*ws.shape, std=1.0 / math.sqrt(ws.shape[0]))
        if ws.role == "experts":                           # [E, in, out]
            return rnd(*ws.shape, std=1.0 / math.sqrt(ws.shape[1]))
        if ws.role == "norm":
            return rnd(*ws.shape, std=0.1, mean=1.0)
        if ws.role in ("bias", "expert_bias", "vector"):
            return rnd(*ws.shape, std=0.1)
        return rnd(*ws.shape)

    ops = model_ops(cfg)
    edge = {ws.key: ws for o in ops if not o.per_layer for ws in o.weights}
    w = {"embed": make(edge["embed"]), "final_norm": make(edge["final_norm"]), "layers": []}
    for i in range(cfg.n_layers):
        w["layers"].append({ws.key: make(ws) for ws in layer_weights(ops, i)})
    w["lm_head"] = w["embed"].t() if cfg.tie_embeddings else make(edge["lm_head"])
    return w


def layer_weights(ops, i: int) -> list:
    """The WeightSpecs layer ``i`` reads (an MoE model's dense and routed layers read different ones)."""
    return [ws for o in ops if o.per_layer and i in o.layers for ws in o.weights]
