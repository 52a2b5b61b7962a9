"""FlopCounterMode's count of transformers' forward for mixtures of experts and latent attention (issue 21),
split by what ran, beside ours (``roofline.workload.prefill``) summed by op kind. Extends tests/hf_flops.py
(its config reader, windows and attention convention are reused, not copied).

``hf_flop_split_moe(config_path, seq_len)`` runs one prefill of ``seq_len`` tokens at batch 1, keeping the
last position's logits, and sorts the counted FLOPs by the module that ran them:

- "experts": the routed experts' GEMMs (the ``*Experts`` modules);
- "router": the gate GEMMs (the ``*Router`` modules' hidden x E product) and Qwen2-MoE's
  ``shared_expert_gate`` (hidden -> 1; also reported alone as "shared_gate", so a comparison can move it);
- "linear": every other ``nn.Linear``: attention projections (MLA's q_a/q_b/kv_a/kv_b too), lm_head, dense
  MLPs, shared experts;
- "attention": what an attention module runs outside its linears (q k^T and p v), per layer;
- "other": the rest of "total" (none in these models).

Two ways to run, both counting only the experts each token was routed to:

- a folder holding ``model.safetensors`` (tests/hf_tiny_moe.py's checkpoints): real weights, tokens
  ``hf_tiny.tokens(seq_len)``, transformers' eager experts: a loop over the experts that received tokens,
  each multiplying only its tokens, so FlopCounterMode counts the routed work (``expert_tokens`` gives the
  tokens per expert per MoE layer, from hooks on the routers);
- a bare config (the published ones): the meta device (no weights, no memory), with
  ``experts_implementation="batched_mm"``, which gathers each token's k experts' weights and multiplies
  token by token: k experts per token, from shapes alone (the eager loop's ``nonzero`` cannot run on meta).
  tests/test_hf_flops_moe.py checks the two agree on the tiny configs.

``our_split_moe`` is ours by op kind; ``ratios_moe`` both, with the attention converted by
``hf_flops.to_our_convention``. Run as a script it prints the ratios: ``.venv/bin/python tests/hf_flops_moe.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import hf_flops as HF

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

HERE = Path(__file__).resolve().parent
CONFIGS = HF.CONFIGS / "moe"
# The published configs (tests/data/hf_configs/moe/, README beside them), four layers each: name -> path
REAL = {p.stem: p for p in sorted(CONFIGS.glob("*.json"))}
KINDS = ("linear", "experts", "router", "attention")
# Our kinds that are none of KINDS by name but are counted with one: MLA's kv_b_proj ("mla_up", a GEMM in
# prefill, as transformers runs it) and Qwen2-MoE's shared-expert gate ("gate", a hidden -> 1 GEMM).
KIND_ALIASES = {"mla_up": "linear", "gate": "router"}


def _folder(config_path) -> Path:
    p = Path(config_path)
    return p if p.is_dir() else p.parent


def has_weights(config_path) -> bool:
    return (_folder(config_path) / "model.safetensors").exists()


def _model(config_path):
    """(model, implementation, device) for counting: real weights with eager experts, or meta with batched_mm."""
    if has_weights(config_path):
        kw = {"dtype": torch.float32, "attn_implementation": "eager", "experts_implementation": "eager"}
        model = transformers.AutoModelForCausalLM.from_pretrained(_folder(config_path), **kw)
        return model.eval(), "eager", "cpu"
    config = HF.hf_config(config_path)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager",
                                                              experts_implementation="batched_mm")
    return model.eval(), "batched_mm", "meta"


def _is(module, suffix: str) -> bool:
    return type(module).__name__.lower().endswith(suffix)


_SPLITS: dict = {}


def hf_flop_split_moe(config_path, seq_len: int) -> dict:
    """``_count`` once per (config path, seq_len) per process (a fresh copy each call): the tiny checkpoints'
    folders are fixed for the session, the published files for good."""
    key = (str(Path(config_path).resolve()), int(seq_len))
    if key not in _SPLITS:
        import hf_tiny

        with hf_tiny.one_thread():
            _SPLITS[key] = _count(config_path, seq_len)
    return dict(_SPLITS[key])


def _count(config_path, seq_len: int) -> dict:
    """FlopCounterMode's count of transformers' forward over ``seq_len`` tokens, batch 1 (see the module doc).

    Returns {"linear", "experts", "router", "shared_gate", "attention", "other", "total": FLOPs (ints),
    "attention_layers", "windows", "seq_len", "model_type" (as hf_flops), "moe_layers": the layer indices
    with routed experts, "experts_layers": their expert FLOPs, "expert_tokens": per MoE layer, the tokens
    each expert received (real weights only; None on meta), "implementation": "eager" or "batched_mm"}."""
    config = HF.hf_config(config_path)
    model, impl, device = _model(config_path)
    if device == "meta":
        ids = torch.zeros(1, seq_len, dtype=torch.long, device="meta")
    else:
        import hf_tiny

        ids = torch.tensor([hf_tiny.tokens(seq_len, vocab=config.vocab_size)])
    mask = torch.ones(1, seq_len, dtype=torch.long, device=ids.device)   # see hf_flops: no packed-sequence check
    modules = dict(model.named_modules())
    routed = {}
    hooks = [m.register_forward_hook(lambda mod, inp, out, f=f: routed.__setitem__(f, out[2]))
             for f, m in modules.items() if _is(m, "router")] if device != "meta" else []
    counter = FlopCounterMode(display=False)
    try:
        with torch.no_grad(), counter:
            model(input_ids=ids, attention_mask=mask, use_cache=False, **HF._last_logits_kwarg(model))
    finally:
        for h in hooks:
            h.remove()
    counts = {name: sum(ops.values()) for name, ops in counter.get_flop_counts().items()}
    root = type(model).__name__

    def counted(fqn: str) -> int:
        return counts.get(f"{root}.{fqn}" if fqn else root, 0)

    def layer_of(fqn: str) -> int:
        return int(fqn.split("layers.")[1].split(".")[0])

    experts = {layer_of(f): counted(f) for f, m in modules.items() if _is(m, "experts")}
    router = sum(counted(f) for f, m in modules.items() if _is(m, "router"))
    shared_gate = sum(counted(f) for f, m in modules.items()
                      if isinstance(m, torch.nn.Linear) and f.endswith("shared_expert_gate"))
    linear = sum(counted(f) for f, m in modules.items()
                 if isinstance(m, torch.nn.Linear) and not f.endswith("shared_expert_gate"))
    layers = []
    for f, m in modules.items():
        if type(m).__name__.endswith("Attention") and f.split(".")[-1] in ("self_attn", "attn", "attention"):
            inner = sum(counted(f"{f}.{g}") for g, s in m.named_modules() if g and isinstance(s, torch.nn.Linear))
            layers.append(counted(f) - inner)
    if len(layers) != config.num_hidden_layers:
        raise RuntimeError(f"found {len(layers)} attention modules for {config.num_hidden_layers} layers in "
                           f"{root}: the module names moved")
    total = counts.get("Global", 0)
    attention = sum(layers)
    n_experts = {layer_of(f): m.num_experts for f, m in modules.items() if _is(m, "router")}
    tokens = None
    if routed:
        tokens = tuple(tuple(int(c) for c in torch.bincount(idx.flatten(), minlength=n_experts[layer_of(f)]))
                       for f, idx in sorted(routed.items(), key=lambda kv: layer_of(kv[0])))
    moe = tuple(sorted(experts))
    return {"linear": int(linear), "experts": int(sum(experts.values())), "router": int(router + shared_gate),
            "shared_gate": int(shared_gate), "attention": int(attention),
            "other": int(total - linear - sum(experts.values()) - router - shared_gate - attention),
            "total": int(total), "attention_layers": tuple(int(a) for a in layers),
            "windows": HF.hf_windows(config), "seq_len": int(seq_len), "model_type": config.model_type,
            "moe_layers": moe, "experts_layers": tuple(int(experts[i]) for i in moe),
            "expert_tokens": tokens, "implementation": impl}


def kind_bucket(kind: str) -> str:
    """Our op kind -> the split's bucket: one of KINDS, a ``KIND_ALIASES`` name, a kind naming attention
    ("mla_attention"), or one that starts with a bucket's name; else "other" (norms, rope, residuals, ...)."""
    if kind in KINDS:
        return kind
    if kind in KIND_ALIASES:
        return KIND_ALIASES[kind]
    if "attention" in kind:
        return "attention"
    for k in KINDS:
        if kind.startswith(k):
            return k
    return "other"


def our_split_moe(config_path, seq_len: int) -> dict:
    """Ours: ``roofline.workload.prefill(load_model(path), 1, seq_len, act_dtype="fp32")`` summed by op kind
    (``roofline.layer.op_spec(cfg, name).kind`` through ``kind_bucket``): {KINDS..., "other", "total"}."""
    from roofline import workload as W
    from roofline.layer import op_spec
    from roofline.models import load_model

    path = Path(config_path)
    cfg = load_model(str(path / "config.json" if path.is_dir() else path))
    phase = W.prefill(cfg, 1, seq_len, act_dtype="fp32")
    out = dict.fromkeys(KINDS + ("other", "total"), 0.0)
    for op in phase.ops:
        spec = op_spec(cfg, op.name)
        flops = _gemm_flops(spec, seq_len) * op.count if spec.kind in ("experts", "router", "gate") else op.total.flops
        out[kind_bucket(spec.kind)] += flops
        out["total"] += flops
    return out


def _gemm_flops(spec, T: int) -> float:
    """The matmul FLOPs of a routed-expert, router or gate op for T tokens: what FlopCounterMode counts. Our
    formulas add the elementwise work inside these ops (activation, routing-weight multiply, softmax / top-k,
    biases), which the counter does not see; at hidden 64 it is a few percent, at real sizes under 0.1%."""
    d = spec.dims
    if spec.kind == "experts":
        return 2 * T * d["k"] * 3 * d["hidden"] * d["intermediate"]
    if spec.kind == "router":
        return 2 * T * d["in_features"] * d["n_experts"]
    return 2 * T * d["in_features"]           # Qwen2-MoE's shared-expert gate: [H, 1]


def _ratio(ours: float, theirs: float) -> float:
    if theirs == 0:
        return 1.0 if ours == 0 else float("inf")
    return ours / theirs


def ratios_moe(config_path, seq_len: int, theirs: dict | None = None) -> dict:
    """ours / theirs for linear, experts, router and attention (theirs converted by
    ``hf_flops.to_our_convention``). Qwen2-MoE's shared-expert gate (hidden -> 1) may be ours as a linear or
    as part of the router: of the two placements, the one closer to ours is used ("shared_gate_as")."""
    theirs = theirs or hf_flop_split_moe(config_path, seq_len)
    ours = our_split_moe(config_path, seq_len)
    best = None
    for place in ("router", "linear"):
        g = theirs["shared_gate"] if place == "linear" else 0
        r = {"linear": _ratio(ours["linear"], theirs["linear"] + g),
             "experts": _ratio(ours["experts"], theirs["experts"]),
             "router": _ratio(ours["router"], theirs["router"] - g),
             "attention": _ratio(ours["attention"], HF.to_our_convention(theirs)),
             "shared_gate_as": place}
        worst = max(abs(r[k] - 1) for k in KINDS)
        if best is None or worst < best[0]:
            best = (worst, r)
        if not theirs["shared_gate"]:
            break
    return {**best[1], "ours": ours, "theirs": theirs}


def _main(argv) -> int:
    """Print ours/theirs per published config (meta) and per tiny checkpoint (real weights)."""
    seqs = [int(a) for a in argv] or [64, 512]
    sys.path.insert(0, str(HERE))
    import hf_tiny_moe

    print(f"transformers {transformers.__version__}, torch {torch.__version__}; ours / FlopCounterMode")
    print(f"{'config':22s} {'type':12s} {'seq':>5s} {'linear':>8s} {'experts':>8s} {'router':>8s} {'attention':>9s}")
    rows = list(REAL.items()) + [(f"tiny {mt}", hf_tiny_moe.checkpoint(mt)) for mt in hf_tiny_moe.MODEL_TYPES]
    for name, path in rows:
        for s in seqs:
            if s > HF.hf_config(path).max_position_embeddings:
                continue
            theirs = hf_flop_split_moe(path, s)
            try:
                r = ratios_moe(path, s, theirs)
                print(f"{name:22s} {theirs['model_type']:12s} {s:5d} {r['linear']:8.4f} {r['experts']:8.4f} "
                      f"{r['router']:8.4f} {r['attention']:9.4f}")
            except Exception as e:   # a refusal of ours is a finding: print it on the row
                print(f"{name:22s} {theirs['model_type']:12s} {s:5d} {type(e).__name__}: {e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
