"""transformers' own counts of its hybrid and sparse-attention models (issue 32: Gated DeltaNet, Mamba-2, DeepSeek
Sparse Attention): the parameters a checkpoint stores (``stored_params``) and FlopCounterMode's count of one
prefill split by the module that ran each FLOP (``flop_split``). Shared by tests/test_deltanet.py,
tests/test_mamba.py, tests/test_dsa.py and tests/test_published_hybrids.py.

``stored_params(model)``: its parameters' elements plus the routers' ``e_score_correction_bias`` (a buffer in
transformers, a tensor of the checkpoint and a weight of ours).

``flop_split(c, seq, meta=False)`` runs one forward of ``seq`` tokens at batch 1 (eager attention, the last
position's logits) and returns, in FLOPs, each module's own count (its count less its children's):

- "linear": every ``nn.Linear`` (the projections, lm_head, dense MLPs, shared experts, the indexer's wq_b / wk /
  weights_proj, Qwen's shared_expert_gate);
- "conv" and "scan": a Gated DeltaNet or Mamba-2 mixer's own work outside its linears: its depthwise conv1d
  (``aten.convolution``) and the rest (the delta rule's or the SSD scan's products);
- "attention": an attention module's own products (q k^T, p v), outside its linears and its indexer;
- "indexer": the DSA indexer's own products (its scores over the keys);
- "experts": the routed experts' GEMMs (the ``*Experts`` / ``*NaiveMoe`` modules), "router": the routers';
- "other": anything else (none in these models: the tests assert it), "total": the counter's whole count.

Two ways to run. Real weights on the CPU (``meta=False``, seeded), with transformers' eager experts, which loop
over the experts that received tokens; or the meta device (``meta=True``: no weights, no memory, the published
widths at no cost) with ``experts_implementation="batched_mm"``, which gathers each token's k experts: k experts
per token from shapes alone (the eager loop's ``nonzero`` cannot run on meta). The attention mask is all ones,
on the CPU either way (transformers' recurrent-layer mask checks ``all(mask == 1)``, which a meta tensor cannot
answer; an all-ones mask changes no count)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

CATEGORIES = ("linear", "conv", "scan", "attention", "indexer", "experts", "router", "other")


def stored_params(model) -> int:
    """The parameters a checkpoint of ``model`` stores (module doc)."""
    return (sum(p.numel() for p in model.parameters())
            + sum(b.numel() for n, b in model.named_buffers() if n.endswith("e_score_correction_bias")))


def _category(fqn: str, m) -> str:
    name = type(m).__name__
    if isinstance(m, torch.nn.Linear):
        return "linear"
    if name.endswith("Experts") or name.endswith("NaiveMoe"):
        return "experts"
    if name.endswith("Router") or fqn.endswith("mlp.gate"):
        return "router"
    if name.endswith("Indexer"):
        return "indexer"
    if "GatedDeltaNet" in name or "Mamba" in name or (name.endswith("Mixer") and "Attention" not in name):
        return "mixer"
    if name.endswith("Attention"):
        return "attention"
    return "other"


def flop_split(c, seq: int, meta: bool = False) -> dict:
    """FlopCounterMode's count of one prefill of transformers' model for config ``c``, split (module doc)."""
    kw = {"attn_implementation": "eager", "experts_implementation": "batched_mm" if meta else "eager"}
    if meta:
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(c, **kw).eval()
    else:
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(c, **kw).eval()
    dev = "meta" if meta else "cpu"
    ids = (torch.arange(seq, device=dev) % c.vocab_size).unsqueeze(0)
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        model(input_ids=ids, attention_mask=torch.ones(1, seq, dtype=torch.long), use_cache=False,
              logits_to_keep=1)
    counts = counter.get_flop_counts()
    root = type(model).__name__

    def got(fqn: str, conv=None) -> int:
        ops = counts.get(f"{root}.{fqn}" if fqn else root, {})
        return sum(v for k, v in ops.items() if conv is None or ("convolution" in str(k)) == conv)

    out = dict.fromkeys(CATEGORIES, 0)
    for fqn, m in model.named_modules():
        children = [f"{fqn}.{g}" if fqn else g for g, _ in m.named_children()]
        kind = _category(fqn, m)
        if kind == "mixer":     # the conv and the scan apart; its linears are children
            out["conv"] += got(fqn, True) - sum(got(ch, True) for ch in children)
            out["scan"] += got(fqn, False) - sum(got(ch, False) for ch in children)
        else:
            out[kind] += got(fqn) - sum(got(ch) for ch in children)
    out["total"] = sum(counts["Global"].values())
    assert sum(out[k] for k in CATEGORIES) == out["total"]          # every FLOP counted once
    return out
