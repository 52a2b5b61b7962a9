"""Model families: one file per Hugging Face ``model_type`` family, each registering a ``Family``
(``registry``: its config.json reader, its checkpoint's tensor names, its presets with their sources).

Importing this package loads every family below, in the order the supported list names them;
``read_hf_config`` reads a config.json through the family of its model_type. Adding a family: write
``roofline/families/<name>.py`` (a reader over ``reader.HFReader``, usually starting from
``llama.llama_like``; ``register(Family(model_type, reader, tensors=..., presets=...))``) and import it
here. A new kind of op is not a family's: it goes in the op-kind registry (``roofline/ops``) with a runner
in ``kernels``.
"""

from __future__ import annotations

from . import (  # noqa: F401 (each module registers its family)
    llama, qwen2, qwen3, phi3, gemma, mixtral, qwen_moe, deepseek_v3, gpt_oss, smollm3, granite,
    glm4_moe, olmo2, minimax_m2, qwen3_next, seed_oss, olmo3, exaone4, ernie4_5_moe, hy_v3, llama4,
    deepseek_v32, nemotron_h, granitemoehybrid, falcon_h1, deepseek_v4
)
from .hf_config import read_hf_config
from .registry import (Family, Preset, Tensors, edit_ops, families, family, model_types, preset, presets, register,
                       tensors)

__all__ = ["Family", "Preset", "Tensors", "edit_ops", "families", "family", "model_types", "preset", "presets",
           "read_hf_config", "register", "tensors"]
