"""The tensor-parallel model against the single-device one: the same logits, from the same seed.

    from profiler.tp_check import tp_logits_check
    tp_logits_check(2, load_model("tiny"))      # {"prefill": (max abs err, max abs logit), ...}

Every rank builds ``LlamaModel(..., tp=TPGroup(rank, N))`` (its shard of the seeded weights) and runs
the same requests: a prefill, a decode step after it, and a chunked prefill of the same prompt in
another slot; rank 0 also runs the single-device model and compares. The only difference allowed is
the rounding of the row-parallel partial sums (the all-reduce adds N partial GEMMs).
"""

from __future__ import annotations

from roofline.parallel import shard

from .distributed import check_tp, run_ranks

CASES = ("prefill", "decode", "chunked prefill")


def _requests(m, prompt, chunk: int) -> dict:
    import torch

    out = {"prefill": m.prefill(prompt, 0)}
    nxt = out["prefill"].argmax()[None]
    out["decode"] = m.decode_step(nxt, torch.tensor([0]))[0]
    for i in range(0, len(prompt), chunk):                      # the same prompt, chunk by chunk, in slot 1
        last = i + chunk >= len(prompt)
        got = m.prefill(prompt[i:i + chunk], 1, logits=last)
    out["chunked prefill"] = got
    return out


def _model(cfg, opts, tp=None):
    from kernels.model import LlamaModel   # kernels imports torch: deferred, the CLI starts without it

    return LlamaModel(cfg, dtype=opts["dtype"], backend=opts["backend"], device=opts["device"], seed=opts["seed"],
                      max_slots=2, max_len=len(opts["prompt"]) + 2, tp=tp)


def _run(ctx, cfg, opts):
    import torch

    prompt = torch.tensor(opts["prompt"], device=ctx.device)
    got = _requests(_model(cfg, dict(opts, device=ctx.device), ctx.tp), prompt, opts["chunk"])
    if ctx.rank != 0:
        return None
    ref = _requests(_model(cfg, dict(opts, device=ctx.device)), prompt, opts["chunk"])
    return {k: (float((got[k] - ref[k]).abs().max()), float(ref[k].abs().max())) for k in CASES}


def _follow(ctx, cfg, opts):
    _run(ctx, cfg, opts)


def tp_logits_check(tp: int, cfg, *, dtype: str = "fp32", backend: str = "torch", device: str = "cpu",
                    seed: int = 0, prompt_tokens: int = 12, chunk: int = 5) -> dict:
    """{case: (max |TP logits - single-device logits|, max |logit|)} over ``tp`` ranks (rank 0's answer)."""
    check_tp(tp, device)
    shard(cfg, tp)
    prompt = [(7 * i + 3) % cfg.vocab for i in range(prompt_tokens)]
    opts = {"dtype": dtype, "backend": backend, "device": device, "seed": seed, "prompt": prompt, "chunk": chunk}
    return run_ranks(tp, device, _run, _follow, (cfg, opts), threads=1 if device == "cpu" else None)
