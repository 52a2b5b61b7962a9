"""Issue 21: the MoE kernels. kernels/router.py against transformers' own routers (same ids, same weights,
ties included) and a plain reimplementation; kernels/moe.py (alignment, the fused expert GEMM under the
Triton interpreter, the torch peer) against the fp64 expert loop."""

import pytest
import torch

from kernels import moe as M
from kernels import router as R
from kernels.backend import get_ops
from roofline import formulas as F
from roofline.errors import RooflineError


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(2024)


# ---------------------------------------------------------------- router vs transformers

def _hf_router(name):
    tf = pytest.importorskip("transformers")
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssTopKRouter
    from transformers.models.mixtral.modeling_mixtral import MixtralTopKRouter
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    if name == "mixtral":
        return MixtralTopKRouter(tf.MixtralConfig(hidden_size=32, num_local_experts=8, num_experts_per_tok=2))
    if name.startswith("qwen3"):
        return Qwen3MoeTopKRouter(tf.Qwen3MoeConfig(hidden_size=32, num_experts=8, num_experts_per_tok=3,
                                                    norm_topk_prob=name.endswith("norm")))
    if name == "gpt_oss":
        return GptOssTopKRouter(tf.GptOssConfig(hidden_size=32, num_local_experts=8, num_experts_per_tok=4))
    return DeepseekV3TopkRouter(tf.DeepseekV3Config(hidden_size=32, n_routed_experts=16, num_experts_per_tok=4,
                                                    n_group=4, topk_group=2, routed_scaling_factor=2.5,
                                                    norm_topk_prob=True))


OURS = {"mixtral": dict(k=2, kind="softmax_topk"), "qwen3": dict(k=3, kind="softmax_topk", renorm=False),
        "qwen3-norm": dict(k=3, kind="softmax_topk"), "gpt_oss": dict(k=4, kind="topk_softmax"),
        "deepseek_v3": dict(k=4, kind="sigmoid_group", n_group=4, topk_group=2, scale=2.5)}


@pytest.mark.parametrize("name", list(OURS))
@pytest.mark.parametrize("ties", [False, True])
def test_route_equals_transformers(name, ties, gen):
    hf = _hf_router(name)
    with torch.no_grad():
        # ties: weights on a coarse grid and one-hot-ish inputs make many logits exactly equal
        w = torch.randn(hf.weight.shape, generator=gen)
        hf.weight.copy_(w.round() if ties else w)
        if hasattr(hf, "bias"):
            hf.bias.copy_(torch.randn(hf.bias.shape, generator=gen).round() if ties else torch.randn(
                hf.bias.shape, generator=gen))
        kw = dict(OURS[name])
        if name == "deepseek_v3":
            hf.e_score_correction_bias.copy_(torch.randn(16, generator=gen) * 0.1 * (not ties))
            kw["bias"] = hf.e_score_correction_bias
        x = torch.randn(37, 32, generator=gen)
        if ties:
            x = (x > 1).float()
        logits, w_ref, ids_ref = hf(x)
        w_ours, ids_ours = R.route(logits, **kw)
    assert ids_ours.dtype == torch.int64 and w_ours.dtype == torch.float32
    assert w_ours.shape == ids_ours.shape == (37, kw["k"])
    assert torch.equal(ids_ours, ids_ref)
    assert torch.equal(w_ours, w_ref.float())
    if ties:
        assert (logits[:, :, None] == logits[:, None, :]).sum() > logits.numel()    # there were ties


@pytest.mark.parametrize("kw", [dict(kind="softmax_topk"), dict(kind="softmax_topk", renorm=False),
                                dict(kind="topk_softmax"), dict(kind="sigmoid_group"),
                                dict(kind="sigmoid_group", n_group=4, topk_group=2, scale=2.5, renorm=False)])
def test_route_equals_plain_reimplementation(kw, gen):
    logits = torch.randn(23, 16, generator=gen).to(torch.bfloat16)
    if kw["kind"] == "sigmoid_group":
        kw = dict(kw, bias=torch.randn(16, generator=gen) * 0.2)
    w, ids = R.route(logits, 3, **kw)
    w_ref, ids_ref = R.reference(logits, 3, **kw)
    assert R.same_routing(w, ids, w_ref, ids_ref) < 1e-6
    if kw.get("renorm", True) and kw["kind"] != "sigmoid_group":
        assert torch.allclose(w.sum(-1), torch.ones(23))
    # a different expert set is caught
    assert R.same_routing(w, (ids + 1) % 16, w_ref, ids_ref) == float("inf")


@pytest.mark.parametrize("args,kw,match", [
    ((torch.zeros(4, 8), 9), dict(kind="softmax_topk"), "from 1 to the 8 experts"),
    ((torch.zeros(4, 8), 2), dict(kind="top2"), "softmax_topk, topk_softmax, sigmoid_group"),
    ((torch.zeros(8), 2), dict(kind="softmax_topk"), r"\[tokens, experts\]"),
    ((torch.zeros(4, 8), 2), dict(kind="sigmoid_group", n_group=3), "must divide the 8 experts"),
    ((torch.zeros(4, 8), 2), dict(kind="sigmoid_group", n_group=8), "2 or more"),
    ((torch.zeros(4, 8), 3), dict(kind="sigmoid_group", n_group=4, topk_group=1), "at least k = 3"),
    ((torch.zeros(4, 8), 2), dict(kind="sigmoid_group", bias=torch.zeros(7)), r"tensor \[8\]")])
def test_route_refusals(args, kw, match):
    with pytest.raises(RooflineError, match=match) as e:
        R.route(*args, **kw)
    assert "\n" not in str(e.value)


# ---------------------------------------------------------------- alignment

def test_moe_align_structure():
    ids = torch.tensor([[0, 2], [2, 3], [0, 2], [3, 0]])                 # expert 1 and 4: no tokens
    a = M.moe_align(ids, 5, 4)
    assert a.counts.tolist() == [3, 0, 3, 2, 0]
    assert int(a.n_padded) == 12                                         # 4 + 4 + 4 (expert 3: 2 padded to 4)
    # buffers at their largest: 8 entries + min(5, 8) * 3 = 23 -> 24 rows, 6 blocks
    assert a.sorted_ids.shape == (24,) and a.block_expert.tolist() == [0, 2, 3, 5, 5, 5]
    assert a.sorted_ids[:12].tolist() == [0, 4, 7, 8, 1, 2, 5, 8, 3, 6, 8, 8]   # entry t*k + j; 8 = padding
    flat = ids.reshape(-1)
    for b, e in enumerate(a.block_expert[:3].tolist()):
        rows = a.sorted_ids[4 * b:4 * b + 4]
        assert (flat[rows[rows < 8].long()] == e).all()


def test_moe_align_every_entry_once(gen):
    ids = torch.stack([torch.randperm(8, generator=gen)[:2] for _ in range(37)])
    a = M.moe_align(ids, 8, 16)
    real = a.sorted_ids[a.sorted_ids < 74]
    assert sorted(real.tolist()) == list(range(74))
    assert int(a.n_padded) == int(((a.counts + 15) // 16 * 16).sum())


# ---------------------------------------------------------------- the fused expert GEMM

def _case(gen, T, E, k, H, I, dt, *, bias=False, uneven=False, empty=None):  # noqa: E741
    r = lambda *s: (torch.randn(*s, generator=gen) * 0.3).to(dt)  # noqa: E731
    logits = torch.randn(T, E, generator=gen)
    if uneven:
        logits[:, 0] += 3.0                                              # expert 0 takes most tokens
    if empty is not None:
        logits[:, empty] = -1e9                                          # expert `empty` gets none
    w, ids = R.route(logits, k, kind="softmax_topk")
    args = (r(T, H), r(E, H, I), r(E, H, I), r(E, I, H), w, ids)
    bb = dict(b_gate=r(E, I), b_up=r(E, I), b_down=r(E, H)) if bias else {}
    return args, bb


def _ref(args, bb, act):
    dbl = [t.double() if t.is_floating_point() else t for t in args]
    return M.reference(*dbl, activation=act, compute_dtype=torch.float64, **{k: v.double() for k, v in bb.items()})


def _err(y, ref):
    return float((y.double() - ref).abs().max() / ref.abs().max()) if torch.isfinite(y).all() else float("inf")


SMALL = dict(block_m=16, block_n=16, block_k=16)


@pytest.mark.parametrize("T,act,bias,dt,tol", [(37, "silu", False, torch.float32, 1e-5),
                                               (37, "swiglu_oai", True, torch.float32, 1e-5),
                                               (1, "silu", False, torch.float32, 1e-5),
                                               (5, "swiglu_oai", True, torch.float16, 2e-3),
                                               (9, "silu", True, torch.bfloat16, 1.6e-2)])
def test_moe_experts_against_reference(T, act, bias, dt, tol, gen):
    args, bb = _case(gen, T, 6, 2, 40, 24, dt, bias=bias, uneven=True, empty=5)
    assert 5 not in args[5].tolist() and (args[5] == 0).sum() > T // 2  # an empty expert, an overloaded one
    out = torch.full((T, 40), float("nan"), dtype=dt)
    y = M.moe_experts(*args, activation=act, out=out, **SMALL, **bb)
    assert y is out and y.shape == (T, 40) and y.dtype == dt
    assert _err(y, _ref(args, bb, act)) < tol


def test_moe_experts_default_configs(gen):
    # the skinny and tiled configurations as moe_config chooses them, k = 3
    for T in (2, 70):
        args, _ = _case(gen, T, 4, 3, 48, 40, torch.float32)
        c = M.moe_config(T, 4, 3, 48, 40, torch.float32)
        assert c["kind"] == ("skinny" if T * 3 <= 16 * 4 else "tiled")
        assert _err(M.moe_experts(*args), _ref(args, {}, "silu")) < 1e-5


def test_moe_config_kinds():
    c = M.moe_config(1, 8, 2, 4096, 14336, torch.bfloat16)               # decode: 2 rows over 8 experts
    assert (c["kind"], c["block_m"], c["block_k"], c["num_warps"]) == ("skinny", 16, 64, 4)
    c = M.moe_config(512, 8, 2, 4096, 14336, torch.bfloat16)             # prefill: 128 rows per expert
    assert (c["kind"], c["block_m"], c["num_warps"]) == ("tiled", 64, 8)   # two accumulators: 4 warps spilled
    assert M.moe_config(512, 8, 2, 64, 64, torch.float32, block_m=16)["block_m"] == 16
    with pytest.raises(ValueError, match="power of two of at least 16"):
        M.moe_config(1, 8, 2, 64, 64, block_n=24)


def test_torch_peer_and_backend(gen):
    args, bb = _case(gen, 11, 4, 2, 32, 16, torch.float32, bias=True)
    ref = _ref(args, bb, "swiglu_oai")
    assert _err(M.torch_moe(*args, activation="swiglu_oai", **bb), ref) < 1e-5
    assert get_ops("triton").moe_experts is M.moe_experts and get_ops("torch").moe_experts is M.torch_moe
    assert get_ops("triton").route is R.route and get_ops("torch").route is R.route


def test_moe_experts_refusals(gen):
    args, bb = _case(gen, 3, 4, 2, 32, 16, torch.float32, bias=True)
    with pytest.raises(RooflineError, match="silu, swiglu_oai"):
        M.moe_experts(*args, activation="gelu")
    with pytest.raises(ValueError, match="b_gate"):
        M.moe_experts(*args, b_gate=bb["b_gate"])
    with pytest.raises(ValueError, match=r"w_down must have shape \[4, 16, 32\]"):
        M.moe_experts(*args[:3], args[3].transpose(1, 2).contiguous(), *args[4:])
    bad = args[5].clone()
    bad[0, 0] = 4
    with pytest.raises(ValueError, match="experts 0..3"):
        M.moe_experts(*args[:5], bad)


def test_cost_is_the_formula():
    assert M.cost(4, 4096, 14336, 8, 2) == F.moe_experts(4, 4096, 14336, 8, 2)
    assert M.cost(4, 64, 32, 8, 2, torch.float32, distinct=3, activation="swiglu_oai", bias=True) == F.moe_experts(
        4, 64, 32, 8, 2, distinct=3, activation="swiglu_oai", bias=True, weight_dtype="fp32", act_dtype="fp32")
    assert R.cost(4, 8, 2) == F.routing(4, 8, 2)
