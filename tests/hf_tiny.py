"""Tiny real checkpoints built with transformers' own code, and transformers' own logits for them.

For each supported ``model_type`` (``MODEL_TYPES``): ``tiny_config(model_type)`` is a few-layer float32
config that exercises every feature of the family (biases, qk-norm, windows, softcaps, fused projections,
tying, ``head_dim`` independent of hidden/heads where the family allows); ``build_checkpoint`` saves it with
``save_pretrained(safe_serialization=True)`` (``config.json`` + ``model.safetensors``) with seeded random
weights scaled so the logits are O(1); ``reference_logits`` gives transformers' fp32 logits (eager attention)
for one full forward and for a cached prefill followed by one-token decode steps, past the window.

``checkpoint(model_type)`` and ``reference(model_type)`` cache both per test session (per process).
How a parity test uses a ``Reference`` r: our full prefill of r.sequence ~ r.prefill; our prefill of
r.sequence[:r.prompt] then one-token decode steps ~ r.decode; chunked prefill and prefix reuse give, at each
position, the same logits as the full prefill, so they compare against r.prefill's rows (positions past
``WINDOW`` check the window). ``prefill_logits(folder, tokens)`` is one uncached forward of any tokens.

Written against transformers 5.24 (``BUILT_WITH``). Fields that moved between 4.4x and 5.x are guarded:
- RoPE: 4.4x ``rope_theta`` / ``rope_scaling`` / ``rope_local_base_freq`` became 5.x ``rope_parameters``
  (per layer type for Gemma-3). We pass the 4.4x keywords, which 5.x converts; the saved ``config.json``
  is then in the installed version's spelling (5.x: ``rope_parameters``, no ``rope_theta``).
- Gemma's activation: ``hidden_activation`` (4.4x) / ``hidden_act`` (5.x): both are given.
- Gemma-2/3 layer pattern: ``sliding_window_pattern`` (<= 4.52) / ``layer_types`` (>= 4.53): both are given.
- The KV cache: ``past_key_values`` (4.x) / ``cache`` (5.x) in and out of ``forward`` (``cache_kwarg``).
- ``torch_dtype`` (4.4x) / ``dtype`` (5.x) in ``from_pretrained``; ``num_logits_to_keep`` (4.45-4.49) /
  ``logits_to_keep`` (>= 4.50) in ``forward`` (``logits_kwarg``).
- The sliding-window mask: 5.x lets a windowed query see ``sliding_window`` keys, itself included
  (key > query - window). Some 4.4x releases differed by one, and Qwen2's eager attention ignored the
  window; the smoke test (tests/test_hf_tiny.py) checks transformers against itself, not these semantics.
"""

from __future__ import annotations

import contextlib
import inspect
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

BUILT_WITH = "5.24.0"   # the transformers version these fixtures were written and checked against
MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma", "gemma2", "gemma3_text", "smollm3",
               "granite", "olmo2", "seed_oss", "olmo3", "exaone4")
GEMMA_FAMILY = ("gemma", "gemma2", "gemma3_text")   # RMSNorm multiplies by (1 + w)
WINDOW = 8                # every sliding window here: shorter than the prompts below
PROMPT = 5                # reference(): tokens of the cached prefill
TOKENS = 20               # reference(): positions in all, well past the window

# What every tiny config shares: 3 layers (Gemma-2/3 alternate, Qwen2's max_window_layers splits them),
# hidden 64, 4 query heads over 2 KV heads (GQA 2:1), an MLP width that is no multiple of 64.
_COMMON = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=256, max_position_embeddings=256, rms_norm_eps=1e-6,
               initializer_range=0.02, use_cache=True, pad_token_id=0, bos_token_id=1, eos_token_id=2)
_ALTERNATE = ["sliding_attention", "full_attention", "sliding_attention"]   # Gemma-2 / Gemma-3 (pattern 2)

_CONFIGS = {
    # untied lm_head, a RoPE base that is not the default
    "llama": ("LlamaConfig", dict(head_dim=16, tie_word_embeddings=False, rope_theta=500000.0,
                                  attention_bias=False, mlp_bias=False)),
    # every layer over an 8-key window; head_dim 32 with hidden 64 / 4 heads (as Mistral-NeMo's 128 != 5120/32)
    "mistral": ("MistralConfig", dict(head_dim=32, sliding_window=WINDOW, tie_word_embeddings=False)),
    # q/k/v biases (always on in Qwen2); layer 0 full, layers >= max_window_layers slide
    "qwen2": ("Qwen2Config", dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1,
                                  tie_word_embeddings=False, rope_theta=1000000.0)),
    # qk-norm (always on in Qwen3), head_dim 32 independent of hidden / heads, no biases
    "qwen3": ("Qwen3Config", dict(head_dim=32, attention_bias=False, use_sliding_window=False,
                                  tie_word_embeddings=False, rope_theta=1000000.0)),
    # fused qkv_proj and gate_up_proj (always in Phi-3), every layer over the window, RoPE on half of each head
    # (Phi-4-mini's partial rotary: 0.75 of 128)
    "phi3": ("Phi3Config", dict(sliding_window=WINDOW, tie_word_embeddings=False,
                                original_max_position_embeddings=256, rope_scaling=None, partial_rotary_factor=0.5)),
    # GeGLU (tanh), sqrt(hidden) embedding scale, (1+w) norms, head_dim 32 with hidden 64, tied by default
    "gemma": ("GemmaConfig", dict(head_dim=32, hidden_act="gelu_pytorch_tanh",
                                  hidden_activation="gelu_pytorch_tanh")),
    # + four norms per layer, softcaps small enough to bite on O(1) values, query_pre_attn_scalar != head_dim,
    # layers 0 and 2 slide, layer 1 full
    "gemma2": ("Gemma2Config", dict(head_dim=32, hidden_activation="gelu_pytorch_tanh",
                                    hidden_act="gelu_pytorch_tanh", query_pre_attn_scalar=24,
                                    attn_logit_softcapping=2.0, final_logit_softcapping=1.5,
                                    sliding_window=WINDOW, layer_types=_ALTERNATE)),
    # + qk-norm, a RoPE base per layer type (1e6 full, 1e4 sliding), no softcaps, layers 0 and 2 slide
    # NoPE on the middle layer (no_rope_layers 0), untied, a RoPE base that is not the default
    "smollm3": ("SmolLM3Config", dict(no_rope_layers=[1, 0, 1], tie_word_embeddings=False, rope_theta=500000.0,
                                      attention_bias=False, mlp_bias=False, use_sliding_window=False)),
    # every multiplier away from 1 (the attention's in place of 1/sqrt(head_dim)), q/k/v/o biases
    "granite": ("GraniteConfig", dict(embedding_multiplier=3.0, residual_multiplier=0.5, attention_multiplier=0.2,
                                      logits_scaling=2.5, attention_bias=True, tie_word_embeddings=False)),
    # norms only after attention and the MLP, qk-norm over the whole projections, head_dim 32 with hidden 64
    "olmo2": ("Olmo2Config", dict(head_dim=32, tie_word_embeddings=False, rope_theta=500000.0)),
    # OLMo-2's layer, layers 0 and 2 over the window; one RoPE base, YaRN on the full layer's RoPE only (as the
    # published configs)
    "olmo3": ("Olmo3Config", dict(head_dim=32, tie_word_embeddings=False, sliding_window=WINDOW,
                                  layer_types=_ALTERNATE, rope_theta=500000.0,
                                  rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                "original_max_position_embeddings": 64})),
    # OLMo-2's norms with per-head qk-norm; layers 0 and 2 local (over the window, RoPE), layer 1 global (NoPE)
    "exaone4": ("Exaone4Config", dict(head_dim=32, tie_word_embeddings=False, sliding_window=WINDOW,
                                      sliding_window_pattern=2, layer_types=_ALTERNATE, rope_theta=1000000.0)),
    # q/k/v biases without an o_proj bias (attention_bias, attention_out_bias), MLP biases, head_dim 32
    "seed_oss": ("SeedOssConfig", dict(head_dim=32, attention_bias=True, attention_out_bias=False, mlp_bias=True,
                                       tie_word_embeddings=False, rope_theta=10000000.0)),
    "gemma3_text": ("Gemma3TextConfig", dict(head_dim=32, hidden_activation="gelu_pytorch_tanh",
                                             query_pre_attn_scalar=24, sliding_window=WINDOW,
                                             sliding_window_pattern=2, layer_types=_ALTERNATE,
                                             rope_theta=1000000.0, rope_local_base_freq=10000.0,
                                             final_logit_softcapping=None, attn_logit_softcapping=None)),
}

# Weight scales: activations and logits come out O(1) with hidden 64.
LINEAR_STD = 0.1      # every 2-D weight but the embedding
EMBED_STD = 0.1       # the embedding (also the lm_head where tied)
BIAS_STD = 0.3        # biases: large enough that dropping them fails a 1e-4 parity
NORM_SPREAD = 0.4     # norm weights: uniform in base +- spread; base 1, or 0 for Gemma's stored w of (1 + w)


@contextlib.contextmanager
def one_thread():
    """torch on one thread while inside, restored after: these models are tiny, and on a shared 2-core box
    two threads spinning over 64-wide tensors are ten times slower than one."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def version() -> str:
    return transformers.__version__


def _major_minor(v: str) -> tuple:
    parts = []
    for p in v.split(".")[:2]:
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def require(model_type: str) -> None:
    """Skip the calling test when the installed transformers cannot build ``model_type`` as written here."""
    if model_type not in _CONFIGS:
        raise ValueError(f"model_type {model_type!r} has no tiny config: known are {', '.join(MODEL_TYPES)}")
    cls_name = _CONFIGS[model_type][0]
    if not hasattr(transformers, cls_name):
        pytest.skip(f"transformers {version()} has no {cls_name}: the {model_type} fixture needs a newer one")
    if _major_minor(version()) < (4, 53):
        pytest.skip(f"transformers {version()} predates layer_types (4.53): the tiny fixtures need >= 4.53")


def tiny_config(model_type: str):
    """A float32 transformers config of ``model_type``: 3 layers, hidden 64, 4 query / 2 KV heads, vocab 256,
    256 positions, every feature of the family on (see ``_CONFIGS``)."""
    require(model_type)
    cls_name, extra = _CONFIGS[model_type]
    cfg = getattr(transformers, cls_name)(**{**_COMMON, **extra})
    setattr(cfg, _DTYPE(), torch.float32)
    return cfg


def _DTYPE() -> str:
    """The dtype keyword of configs and ``from_pretrained``: ``torch_dtype`` became ``dtype`` in 4.56."""
    return "dtype" if _major_minor(version()) >= (4, 56) else "torch_dtype"


def logits_kwarg(model) -> dict:
    """The forward keyword that keeps only the last position's logits (as our lm_head computes): its name moved."""
    params = inspect.signature(model.forward).parameters
    for name in ("logits_to_keep", "num_logits_to_keep"):
        if name in params:
            return {name: 1}
    return {}


def cache_kwarg(model) -> str:
    """The forward keyword of the KV cache: ``past_key_values`` (4.x) became ``cache`` (5.x, the old name
    deprecated until 5.40)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _cache_of(out):
    """The KV cache a forward returned (``out.cache`` in 5.x, ``out.past_key_values`` before)."""
    for name in ("cache", "past_key_values"):
        c = getattr(out, name, None)
        if c is not None:
            return c
    raise RuntimeError(f"transformers {version()}: the forward returned no KV cache ({type(out).__name__})")


def _load(folder):
    folder = Path(folder)
    kw = {_DTYPE(): torch.float32, "attn_implementation": "eager"}
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, **kw)
    return model.eval()


def _randomize(model, model_type: str, seed: int) -> None:
    """Every parameter drawn from ``seed``: 2-D weights N(0, LINEAR_STD) (embedding N(0, EMBED_STD)), biases
    N(0, BIAS_STD), RMSNorm weights U(base - NORM_SPREAD, base + NORM_SPREAD), base 0 for the Gemma family's
    (1 + w) norms and 1 for the others, so a wrong norm convention moves the logits by O(1)."""
    g = torch.Generator().manual_seed(seed)
    norm_params = {id(m.weight) for m in model.modules()
                   if "RMSNorm" in type(m).__name__ and getattr(m, "weight", None) is not None}
    embed = model.get_input_embeddings().weight
    base = 0.0 if model_type in GEMMA_FAMILY else 1.0
    with torch.no_grad():
        for name, p in model.named_parameters():    # tied parameters appear once
            if id(p) in norm_params:
                new = base + (torch.rand(p.shape, generator=g) * 2 - 1) * NORM_SPREAD
            elif p is embed:
                new = torch.randn(p.shape, generator=g) * EMBED_STD
            elif p.ndim == 1:
                new = torch.randn(p.shape, generator=g) * BIAS_STD
            else:
                new = torch.randn(p.shape, generator=g) * LINEAR_STD
            p.copy_(new.to(p.dtype))


def build_checkpoint(model_type: str, folder, seed: int = 0) -> Path:
    """Save a tiny ``model_type`` checkpoint in ``folder`` (config.json + model.safetensors, float32) with
    weights drawn from ``seed``; returns the folder."""
    cfg = tiny_config(model_type)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with one_thread():
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float().eval()
        _randomize(model, model_type, seed)
        model.save_pretrained(folder, safe_serialization=True)
    if not (folder / "model.safetensors").exists():
        raise RuntimeError(f"save_pretrained wrote no model.safetensors in {folder}: {sorted(folder.iterdir())}")
    return folder


@dataclass(frozen=True)
class Reference:
    """transformers' fp32 logits for one sequence.

    ``sequence``: every token, position by position: the given tokens, then ``steps`` greedy ones.
    ``prefill``: [len(sequence), vocab] from one forward over the whole sequence, no cache.
    ``decode``: [len(sequence), vocab] from a cached prefill of ``sequence[:prompt]`` (rows < prompt), then one
    token per step through transformers' own KV cache (rows >= prompt; teacher-forced over the given tokens,
    greedy after them: token i+1 = argmax of row i).
    """
    sequence: tuple
    prompt: int
    prefill: np.ndarray
    decode: np.ndarray


def _logits(out) -> np.ndarray:
    return out.logits[0].detach().to(torch.float32).numpy().copy()


def reference_logits(folder, tokens, *, prompt: int = PROMPT, steps: int = 0) -> Reference:
    """transformers' logits for ``tokens`` (a list of ids) and ``steps`` greedy tokens after them (``Reference``)."""
    tokens = [int(t) for t in tokens]
    if not 1 <= prompt <= len(tokens):
        raise ValueError(f"prompt {prompt} must be between 1 and the {len(tokens)} tokens given")
    seq = list(tokens)
    with one_thread(), torch.no_grad():
        model = _load(folder)
        cache_kw = cache_kwarg(model)
        out = model(input_ids=torch.tensor([seq[:prompt]]), use_cache=True)
        rows = [_logits(out)]
        cache = _cache_of(out)
        pos = prompt
        while pos < len(tokens) + steps:
            if pos >= len(seq):                      # past the given tokens: greedy
                seq.append(int(np.argmax(rows[-1][-1])))
            out = model(input_ids=torch.tensor([[seq[pos]]]), use_cache=True, position_ids=torch.tensor([[pos]]),
                        **{cache_kw: cache})
            cache = _cache_of(out)
            rows.append(_logits(out))
            pos += 1
        decode = np.concatenate(rows, axis=0)
        full = _logits(model(input_ids=torch.tensor([seq]), use_cache=False))
    return Reference(tuple(seq), prompt, full, decode)


def prefill_logits(folder, tokens) -> np.ndarray:
    """transformers' logits [len(tokens), vocab] of one forward over ``tokens``, no cache."""
    with one_thread(), torch.no_grad():
        return _logits(_load(folder)(input_ids=torch.tensor([[int(t) for t in tokens]]), use_cache=False))


def tokens(n: int = TOKENS, seed: int = 0, vocab: int = 256) -> list:
    """``n`` token ids drawn from ``seed`` (no model needed)."""
    return [int(t) for t in np.random.default_rng(seed).integers(3, vocab, size=n)]


class SessionFixtures:
    """Checkpoints built once per session in a temporary folder, and their references, for one family module
    (this one, tests/hf_tiny_moe.py): ``build(model_type, folder, seed)`` and ``reference_logits(folder, tokens,
    prompt=, steps=)`` are the module's own."""

    def __init__(self, build, reference_logits, prefix: str):
        self.build, self.reference_logits, self.prefix = build, reference_logits, prefix
        self.checkpoints: dict = {}
        self.references: dict = {}
        self.root: Path | None = None

    def checkpoint(self, model_type: str, seed: int = 0) -> Path:
        """The tiny ``model_type`` checkpoint of ``seed``, built once per session."""
        key = (model_type, seed)
        if key not in self.checkpoints:
            if self.root is None:
                self.root = Path(tempfile.mkdtemp(prefix=self.prefix))
            self.checkpoints[key] = self.build(model_type, self.root / f"{model_type}-seed{seed}", seed)
        return self.checkpoints[key]

    def reference(self, model_type: str, seed: int = 0, *, n: int = TOKENS - 6, prompt: int = PROMPT,
                  steps: int = 6) -> Reference:
        """``reference_logits`` of ``checkpoint(model_type, seed)`` over ``tokens(n, seed)`` then ``steps`` greedy
        tokens (by default 14 given + 6 greedy = 20 positions, prefill of 5), cached per session."""
        key = (model_type, seed, n, prompt, steps)
        if key not in self.references:
            self.references[key] = self.reference_logits(self.checkpoint(model_type, seed), tokens(n, seed),
                                                         prompt=prompt, steps=steps)
        return self.references[key]


_FIXTURES = SessionFixtures(build_checkpoint, reference_logits, "roofline-hf-tiny-")
checkpoint, reference = _FIXTURES.checkpoint, _FIXTURES.reference
