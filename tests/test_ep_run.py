"""Expert parallelism run as costed (``--tp N --ep N``), on this CPU: two gloo ranks on 127.0.0.1.

Each rank holds E/N whole experts, attention and the rest as under --tp N; a MoE layer's routed rows go to the
rank of their expert (dispatch all-to-all) and come back (combine all-to-all): kernels.tp.ep_experts.

Run: pytest tests/test_ep_run.py   (each test that needs ranks spawns one extra process)
"""

import torch

from profiler.distributed import run_ranks
from roofline.models import load_model

TINY_MOE = load_model("tiny-moe")        # Mixtral layout: 8 experts of 48, top-2, GQA 4:2
PROMPTS = ([(7 * i + 3) % 256 for i in range(12)], [(11 * i + 5) % 256 for i in range(7)])
DECODE_TOKENS = ([17, 42], [99, 3])      # two decode steps over slots 0 and 1


def _ep(ctx):
    from kernels.tp import TPGroup

    return TPGroup(ctx.rank, ctx.world, ep=ctx.world)


def _steps(m) -> dict:
    out = {"prefill": m.prefill(torch.tensor(PROMPTS[0]), 0),
           "prefill, 2nd slot": m.prefill(torch.tensor(PROMPTS[1]), 1)}
    for i, toks in enumerate(DECODE_TOKENS):
        out[f"decode {i + 1}"] = m.decode_step(torch.tensor(toks), torch.tensor([0, 1]))
    return out


def _parity(ctx, cfg):
    from kernels.model import LlamaModel

    kw = dict(dtype="fp32", backend="torch", device="cpu", seed=0, max_slots=2, max_len=16)
    m = LlamaModel(cfg, tp=_ep(ctx), **kw)
    got = _steps(m)
    shapes = ctx.gather(tuple(m.w["layers"][0]["experts_gate"].shape))
    if ctx.rank != 0:
        return None
    want = _steps(LlamaModel(cfg, **kw))
    return {"errs": {k: (float((got[k] - want[k]).abs().max()), float(want[k].abs().max())) for k in want},
            "shapes": shapes}


def test_ep_logits_equal_one_rank_for_a_prefill_and_two_decode_steps():
    r = run_ranks(2, "cpu", _parity, _parity, (TINY_MOE,), threads=1)
    for case, (err, scale) in r["errs"].items():
        assert scale > 0.1 and err <= 1e-5 * scale, (case, err, scale)
    # each rank holds 4 of the 8 whole experts (width 48, not sliced)
    assert r["shapes"] == [(4, 64, 48)] * 2
