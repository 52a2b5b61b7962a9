"""Cross-check of the FLOP formulas against torch's own counter, recorded in the run header.

``flop_check(cfg, ...)`` runs one prefill and one decode step of the kernels' model
(``kernels.model.LlamaModel``, torch backend) with the profiled config cut to ONE layer
(real shapes, a fraction of the memory) under ``torch.utils.flop_counter.FlopCounterMode``
and sets the count beside ``roofline.workload``'s formula totals.

What the counter covers (NB): matmuls (mm/addmm/bmm) and scaled_dot_product_attention
only. It does not count norms, RoPE, SwiGLU, residual adds or the embedding gather
(vector ops we count a few FLOPs per element for), and it ignores the causal mask: its
prefill attention is 4*B*Hq*S*S*D where ours is half that. So three figures are kept:
``formula_total`` (every op), ``formula_covered`` (linear layers + attention, ours) and
``formula_covered_as_counted`` (the same with prefill attention un-halved, what the
counter should report); ``ratio`` = counted / formula_covered_as_counted should be 1.

Run ``python -m profiler.flopcheck`` to print the check for the "small" preset.
"""

from __future__ import annotations

from roofline import workload as W
from roofline.cost import ZERO

from . import cache
from .probes import versions

COVERED_KINDS = ("linear", "attention")   # the ops FlopCounterMode sees: matmuls and attention
COVERS = ("torch FlopCounterMode counts matmuls and scaled_dot_product_attention only (no norms, RoPE, "
          "SwiGLU, adds, gathers) and ignores the causal mask: its prefill attention is 2x ours.")


def _counted(fn) -> tuple[float, dict]:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as fc:
        fn()
    by_op = {str(k): float(v) for k, v in fc.get_flop_counts().get("Global", {}).items()}
    return float(fc.get_total_flops()), by_op


def _formula(phase: W.Phase) -> dict:
    ops = [o for o in W.model_ops(phase.model) if o.kind in COVERED_KINDS]
    covered = sum((phase.op(o.name).total for o in ops), ZERO).flops
    attn = sum(phase.op(o.name).total.flops for o in ops if o.kind == "attention")
    counted_attn = attn
    if phase.phase == "prefill":   # the counter sees the whole S_q x S_kv product: no causal halving, no window
        n, p = phase.new_tokens, phase.cached_tokens
        counted_attn = sum(4 * phase.batch * o.dims["n_heads"] * o.dims["head_dim"] * n * (n + p) * o.count
                           for o in ops if o.kind == "attention")
    return {"formula_total": phase.total.flops, "formula_covered": covered,
            "formula_covered_as_counted": covered - attn + counted_attn, "formula_attention_as_counted": counted_attn}


def flop_check(cfg, *, dtype: str = "fp32", device: str = "cpu", prompt: int = 128, batch: int = 1) -> dict:
    """Counted vs formula FLOPs for a prefill of ``prompt`` tokens then one decode step, one layer."""
    import torch

    from kernels.model import LlamaModel

    one = cfg.with_layers(1)
    prompt = max(1, min(int(prompt), cfg.max_context - 1))
    kw = dict(weight_dtype=dtype, act_dtype=dtype, kv_dtype=dtype)
    model = LlamaModel(one, dtype=dtype, backend="torch", device=device, seed=0, max_slots=1, max_len=prompt + 1)
    tokens = torch.randint(0, cfg.vocab, (prompt,), generator=torch.Generator().manual_seed(0))
    points = []
    with torch.no_grad():
        counted, by_op = _counted(lambda: model.prefill(tokens, 0))
        points.append({"phase": "prefill", "batch": 1, "context": prompt, "counted": counted, "counted_by_op": by_op,
                       **_formula(W.prefill(one, 1, prompt, **kw))})
        counted, by_op = _counted(lambda: model.decode_step(tokens[:1], [0]))
        points.append({"phase": "decode", "batch": 1, "context": prompt, "counted": counted, "counted_by_op": by_op,
                       **_formula(W.decode(one, 1, prompt, **kw))})
    notes = []
    for p in points:
        p["ratio"] = p["counted"] / p["formula_covered_as_counted"] if p["formula_covered_as_counted"] else None
        p["ratio_to_total"] = p["counted"] / p["formula_total"] if p["formula_total"] else None
        if p["phase"] == "prefill" and not any("attention" in k for k in p["counted_by_op"]):
            # e.g. the CPU's _scaled_dot_product_flash_attention_for_cpu has no entry in the counter's table
            rest = p["formula_covered_as_counted"] - p["formula_attention_as_counted"]
            p["ratio_without_attention"] = p["counted"] / rest if rest else None
            notes.append(f"FlopCounterMode saw no scaled_dot_product_attention in prefill on {device} (that SDPA "
                         "kernel is not in its table): the gap is the attention, "
                         f"{p['formula_attention_as_counted']:.4g} FLOPs un-halved; without it the ratio is "
                         f"{p['ratio_without_attention']:.3f}.")
    del model
    first = points[0]
    return {"source": "torch.utils.flop_counter.FlopCounterMode", "covers": COVERS,
            "model": f"{cfg.name}, 1 layer, torch backend, {dtype}",
            "counted": first["counted"], "formula": first["formula_covered_as_counted"], "ratio": first["ratio"],
            "points": points, "notes": notes}


def cached_flop_check(cfg, *, dtype: str = "fp32", device: str = "cpu", prompt: int = 128) -> dict:
    """``flop_check``, cached beside the ceilings: the count depends only on the model's shapes, the dtype,
    the prompt, the device kind and torch's version, so a second run of the same sweep does not pay for it."""
    d = cfg.to_dict()
    d.pop("notes", None)
    key = {"model": d, "dtype": dtype, "device": "cuda" if str(device).startswith("cuda") else "cpu",
           "prompt": int(prompt), "torch": versions().get("torch"), "method": 1}
    path = cache.path("flopcheck", key, digits=16)
    hit = cache.load(path, key)
    if hit is not None and "result" in hit:
        return dict(hit["result"], cached=True)
    fc = flop_check(cfg, dtype=dtype, device=device, prompt=prompt)
    cache.store(path, key, {"result": fc})
    return fc


def flop_check_text(fc: dict) -> str:
    lines = [f"FLOP cross-check ({fc['source']}, {fc['model']}):"]
    for p in fc["points"]:
        lines.append(f"  {p['phase']:<8} counted {p['counted']:.4g}  formula (as counted) "
                     f"{p['formula_covered_as_counted']:.4g}  ratio {p['ratio']:.3f}  (formula, all ops: "
                     f"{p['formula_total']:.4g})")
    lines += ["  " + n for n in fc.get("notes", [])]
    lines.append("  " + fc["covers"])
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    from roofline.models import load_model

    print(flop_check_text(flop_check(load_model("small"))))
