"""transformers' own forward counted by ``torch.utils.flop_counter.FlopCounterMode``, split into linear-layer
GEMMs and attention, beside ours (``roofline.workload.prefill``) in our convention.

``hf_flop_split(config_path, seq_len)`` builds ``AutoModelForCausalLM.from_config`` on the meta device (no
weights, no memory: the real vocabularies cost nothing) with eager attention, runs one prefill of ``seq_len``
tokens at batch 1 keeping only the last position's logits (as our lm_head does), and sorts the counted FLOPs
by the module that ran them: every ``nn.Linear`` (q/k/v/o, the MLP, fused qkv/gate_up, lm_head) is
"linear"; what an attention module runs outside its linears (q k^T and p v) is "attention", per layer.
Anything else (none in the models here) is "other". ``total`` is everything counted.

``to_our_convention(split)`` converts the attention count to ours (the one function that does:
see its docstring). ``our_split(config_path, seq_len)`` is ours, summed by op kind (``roofline.layer``).

Run as a script, it prints ours/theirs per model: ``.venv/bin/python tests/hf_flops.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

HERE = Path(__file__).resolve().parent
CONFIGS = HERE / "data" / "hf_configs"
# The published configs (tests/data/hf_configs/README.md), two layers each: name -> (file, model_type)
REAL = {p.stem: p for p in sorted(CONFIGS.glob("*.json"))}


def hf_config(config_path):
    """The transformers config of a config.json file (or of the folder holding one)."""
    p = Path(config_path)
    return transformers.AutoConfig.from_pretrained(str(p))


def model_type_of(config_path) -> str:
    return hf_config(config_path).model_type


def hf_windows(config) -> tuple:
    """Each layer's attention window as transformers runs it (0: full attention).

    ``layer_types`` (Gemma-2/3, and Qwen2/3 in transformers >= 4.53) names the sliding layers; without it
    (Mistral, Phi-3) every layer slides when ``sliding_window`` is set. ``use_sliding_window`` false
    (Qwen2/3) switches the window off."""
    n = config.num_hidden_layers
    w = getattr(config, "sliding_window", None) or 0
    if getattr(config, "use_sliding_window", True) is False:
        w = 0
    types = getattr(config, "layer_types", None)
    if types:
        return tuple(w if t == "sliding_attention" else 0 for t in types[:n])
    return (w,) * n


def _last_logits_kwarg(model) -> dict:
    import inspect

    params = inspect.signature(model.forward).parameters
    for name in ("logits_to_keep", "num_logits_to_keep"):   # renamed in transformers 4.50
        if name in params:
            return {name: 1}
    raise RuntimeError(f"transformers {transformers.__version__}: forward keeps every position's logits "
                       "(no logits_to_keep): the lm_head count would be seq_len times ours")


def _meta_model(config):
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    return model.eval()


def hf_flop_split(config_path, seq_len: int) -> dict:
    """FlopCounterMode's count of transformers' forward: one prefill of ``seq_len`` tokens, batch 1.

    Returns {"linear", "attention", "other", "total": FLOPs (ints), "attention_layers": per-layer attention
    FLOPs in layer order, "windows": per-layer windows (``hf_windows``), "seq_len", "model_type"}. The
    attention counts are as counted: eager attention multiplies the full S x S score matrix (masked after)."""
    config = hf_config(config_path)
    model = _meta_model(config)
    ids = torch.zeros(1, seq_len, dtype=torch.long, device="meta")
    # An explicit all-ones mask: without one, transformers looks for packed sequences in the position ids,
    # a data-dependent check the meta device cannot answer.
    mask = torch.ones(1, seq_len, dtype=torch.long, device="meta")
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        model(input_ids=ids, attention_mask=mask, use_cache=False, **_last_logits_kwarg(model))
    counts = {name: sum(ops.values()) for name, ops in counter.get_flop_counts().items()}
    modules = dict(model.named_modules())
    root = type(model).__name__

    def counted(fqn: str) -> int:
        return counts.get(f"{root}.{fqn}" if fqn else root, 0)

    linear = sum(counted(f) for f, m in modules.items() if isinstance(m, torch.nn.Linear))
    layers = []
    for f, m in modules.items():
        if type(m).__name__.endswith("Attention") and f.split(".")[-1] in ("self_attn", "attn", "attention"):
            inner = sum(counted(f"{f}.{g}") for g, s in m.named_modules() if g and isinstance(s, torch.nn.Linear))
            layers.append(counted(f) - inner)
    total = counts.get("Global", 0)
    if len(layers) != config.num_hidden_layers:
        raise RuntimeError(f"found {len(layers)} attention modules for {config.num_hidden_layers} layers in "
                           f"{root}: the module names moved")
    attention = sum(layers)
    return {"linear": int(linear), "attention": int(attention), "other": int(total - linear - attention),
            "total": int(total), "attention_layers": tuple(int(a) for a in layers),
            "windows": hf_windows(config), "seq_len": int(seq_len), "model_type": config.model_type}


def window_pairs(seq_len: int, window: int) -> float:
    """(query, key) pairs of a causal prefill of ``seq_len`` tokens from scratch, by our convention: the
    causal triangle is seq_len**2 / 2 (``roofline.formulas.causal_pairs``, the FlashAttention convention);
    a window of W keys (itself included; 0: none) cuts it to the band seq_len*W - W**2/2 once seq_len > W
    (the same triangle convention for the band's first W queries)."""
    s, w = float(seq_len), float(window)
    if not window or s <= w:
        return s * s / 2
    return s * w - w * w / 2


def to_our_convention(split: dict) -> float:
    """FlopCounterMode's attention FLOPs converted to our convention, layer by layer.

    Eager attention (and FlopCounterMode's count of sdpa) multiplies the whole S x S score matrix, q k^T and
    then p v, 2 FLOPs per multiply-add each: 4 * Hq * S * S * D per layer, whatever the mask. We count
    only the pairs a causal, windowed query needs (``window_pairs``: S**2/2 causal, S*W - W**2/2 within a
    window W < S), so each layer's count is scaled by window_pairs(S, W) / S**2: one half for full causal
    attention, less for a sliding layer past its window."""
    s = split["seq_len"]
    return sum(a * window_pairs(s, w) / (s * s) for a, w in zip(split["attention_layers"], split["windows"]))


def our_split(config_path, seq_len: int) -> dict:
    """Ours: ``roofline.workload.prefill(load_model(path), 1, seq_len, act_dtype="fp32")`` summed by op kind
    (``roofline.layer``): {"linear", "attention", "total"} FLOPs."""
    from roofline import workload as W
    from roofline.layer import op_spec
    from roofline.models import load_model

    cfg = load_model(str(config_path))
    phase = W.prefill(cfg, 1, seq_len, act_dtype="fp32")
    out = {"linear": 0.0, "attention": 0.0, "total": 0.0}
    for op in phase.ops:
        kind = op_spec(cfg, op.name).kind
        if kind in ("linear", "attention"):
            out[kind] += op.total.flops
        out["total"] += op.total.flops
    return out


def ratios(config_path, seq_len: int) -> dict:
    """ours / theirs for linear and attention (theirs converted by ``to_our_convention``)."""
    theirs = hf_flop_split(config_path, seq_len)
    ours = our_split(config_path, seq_len)
    return {"linear": ours["linear"] / theirs["linear"],
            "attention": ours["attention"] / to_our_convention(theirs),
            "ours": ours, "theirs": theirs}


def _main(argv) -> int:
    """Print ours/theirs per published config (and per tiny checkpoint) at a few prompt lengths."""
    seqs = [int(a) for a in argv] or [64, 4096]
    print(f"transformers {transformers.__version__}, torch {torch.__version__}; ours / FlopCounterMode "
          "(attention converted by to_our_convention)")
    print(f"{'config':28s} {'type':12s} {'seq':>6s} {'linear':>8s} {'attention':>9s}")
    rows = list(REAL.items())
    sys.path.insert(0, str(HERE))
    import hf_tiny

    for mt in hf_tiny.MODEL_TYPES:
        rows.append((f"tiny {mt}", hf_tiny.checkpoint(mt) / "config.json"))
    for name, path in rows:
        for s in seqs:
            if s > hf_config(path).max_position_embeddings:
                continue
            try:
                r = ratios(path, s)
                print(f"{name:28s} {r['theirs']['model_type']:12s} {s:6d} {r['linear']:8.4f} {r['attention']:9.4f}")
            except Exception as e:   # a refusal of ours is a finding: print it on the row
                print(f"{name:28s} {'':12s} {s:6d} {type(e).__name__}: {e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
