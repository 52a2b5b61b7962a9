"""Llama-style model configs: presets with their reasons, and local HF config.json files.

Nothing is downloaded: ``load_model`` takes a preset name or a path to a config.json.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from .errors import RooflineError


@dataclass(frozen=True)
class ModelConfig:
    name: str
    hidden: int            # d_model
    intermediate: int      # SwiGLU inner width
    n_layers: int
    n_heads: int           # query heads
    n_kv_heads: int        # key/value heads (GQA when < n_heads)
    vocab: int
    max_context: int       # max_position_embeddings
    head_dim: int = 0      # 0: hidden // n_heads
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    tie_embeddings: bool = False

    def __post_init__(self):
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.hidden // max(self.n_heads, 1))
        for f in ("hidden", "intermediate", "n_layers", "n_heads", "n_kv_heads", "vocab", "max_context", "head_dim"):
            v = getattr(self, f)
            if not isinstance(v, int) or v < 1:
                raise RooflineError(f"model {self.name!r}: {f} must be a positive integer, got {v!r}.")
        if self.n_heads % self.n_kv_heads:
            raise RooflineError(f"model {self.name!r}: n_heads ({self.n_heads}) must be a multiple of "
                                f"n_kv_heads ({self.n_kv_heads}).")

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    def params(self) -> int:
        """Parameter count (embedding and lm_head counted separately unless tied)."""
        h = self.hidden
        per_layer = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h + 3 * h * self.intermediate + 2 * h
        emb = self.vocab * h * (1 if self.tie_embeddings else 2)
        return self.n_layers * per_layer + emb + h

    def with_layers(self, n_layers: int) -> "ModelConfig":
        return replace(self, n_layers=n_layers, name=f"{self.name} ({n_layers} layers)")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


# Presets from each model's published config.json (Hugging Face hub), reasons beside.
PRESETS: dict[str, ModelConfig] = {m.name: m for m in [
    ModelConfig("llama-2-7b", 4096, 11008, 32, 32, 32, 32000, 4096),            # MHA
    ModelConfig("llama-2-13b", 5120, 13824, 40, 40, 40, 32000, 4096),           # MHA
    ModelConfig("llama-2-70b", 8192, 28672, 80, 64, 8, 32000, 4096),            # GQA 8:1
    ModelConfig("llama-3-8b", 4096, 14336, 32, 32, 8, 128256, 8192, rope_theta=500000.0),   # GQA 4:1, big vocab
    ModelConfig("llama-3-70b", 8192, 28672, 80, 64, 8, 128256, 8192, rope_theta=500000.0),
    # Mistral's 4096-token sliding window is NB: not modelled (full attention is costed).
    ModelConfig("mistral-7b", 4096, 14336, 32, 32, 8, 32000, 32768),
    # Qwen2.5's q/k/v biases are NB: not modelled (under 0.01% of the FLOPs).
    ModelConfig("qwen2.5-7b", 3584, 18944, 28, 28, 4, 152064, 32768, rope_theta=1e6, rms_eps=1e-6),
    # CPU-sized: ~40M parameters; its ops take milliseconds on two cores, so a sweep is quick.
    ModelConfig("small", 512, 1408, 4, 8, 2, 8192, 2048),
    # Test-sized: small enough for the Triton interpreter.
    ModelConfig("tiny", 64, 176, 2, 4, 2, 256, 512),
]}

_HF_KEYS = {  # our field: (HF key, default or None when required)
    "hidden": ("hidden_size", None),
    "intermediate": ("intermediate_size", None),
    "n_layers": ("num_hidden_layers", None),
    "n_heads": ("num_attention_heads", None),
    "vocab": ("vocab_size", None),
}


def load_model(name_or_path: str) -> ModelConfig:
    """A preset by name, or a local Hugging Face config.json (a file or its folder)."""
    key = str(name_or_path).strip().lower()
    if key in PRESETS:
        return PRESETS[key]
    p = Path(name_or_path)
    if p.is_dir():
        p = p / "config.json"
    if p.suffix == ".json" or p.exists():
        return _from_hf_config(p)
    raise RooflineError(f"Unknown model {name_or_path!r}. Presets: {', '.join(PRESETS)}; "
                        "or give the path to a local Hugging Face config.json.")


def _from_hf_config(p: Path) -> ModelConfig:
    try:
        d = json.loads(p.read_text())
    except FileNotFoundError:
        raise RooflineError(f"model config {p} does not exist.") from None
    except json.JSONDecodeError as e:
        raise RooflineError(f"model config {p} is not valid JSON (line {e.lineno}): {e.msg}.") from None
    if not isinstance(d, dict):
        raise RooflineError(f"model config {p} must hold a JSON object.")
    missing = [hf for hf, _ in _HF_KEYS.values() if hf not in d]
    if missing:
        raise RooflineError(f"model config {p} is missing the key {missing[0]!r} "
                            "(a Llama-style config.json needs hidden_size, intermediate_size, "
                            "num_hidden_layers, num_attention_heads and vocab_size).")
    try:
        return ModelConfig(
            name=str(d.get("_name_or_path") or d.get("model_type") or p.parent.name or "custom"),
            hidden=int(d["hidden_size"]), intermediate=int(d["intermediate_size"]),
            n_layers=int(d["num_hidden_layers"]), n_heads=int(d["num_attention_heads"]),
            n_kv_heads=int(d.get("num_key_value_heads") or d["num_attention_heads"]),
            vocab=int(d["vocab_size"]), max_context=int(d.get("max_position_embeddings", 4096)),
            head_dim=int(d.get("head_dim") or 0), rope_theta=float(d.get("rope_theta", 10000.0)),
            rms_eps=float(d.get("rms_norm_eps", 1e-5)), tie_embeddings=bool(d.get("tie_word_embeddings", False)),
        )
    except (TypeError, ValueError) as e:
        raise RooflineError(f"model config {p} has a bad value: {e}") from None
