"""Our own Llama model (torch backend) traced on the CPU: the trace's costs against roofline.workload's.

Every costed op either equals the workload's op exactly or differs by a reason stated and
checked here: the torch backend runs RMSNorm, SwiGLU, RoPE and decode attention as several
aten ops, each costed as itself (each intermediate is written and read back).
"""

from collections import defaultdict

import pytest

torch = pytest.importorskip("torch")

from kernels.model import LlamaModel  # noqa: E402
from profiler.capture import capture  # noqa: E402
from roofline import formulas as F  # noqa: E402
from roofline import workload as W  # noqa: E402
from roofline.cost import ZERO  # noqa: E402
from roofline.models import load_model  # noqa: E402
from roofline.traces.analyze import analyze_trace  # noqa: E402
from roofline.traces.events import read_trace  # noqa: E402

CFG = load_model("tiny")           # hidden 64, intermediate 176, 2 layers, 4 heads / 2 KV heads, head_dim 16
T = 8                              # prompt tokens
FP = dict(weight_dtype="fp32", act_dtype="fp32", kv_dtype="fp32")


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    torch.manual_seed(0)
    m = LlamaModel(CFG, dtype="fp32", backend="torch", max_slots=2, max_len=64)
    m.prefill(torch.arange(1, T + 1), slot=1)                 # warm-up outside the trace
    path = tmp_path_factory.mktemp("llama") / "llama.json.gz"
    with capture(path) as cap:
        with cap.phase("prefill"):
            m.prefill(torch.arange(1, T + 1), slot=0)
        with cap.phase("decode"):
            m.decode_step(torch.tensor([3]), torch.tensor([0]))
    r = analyze_trace(read_trace(path))
    ops = defaultdict(dict)
    for ms in r.measurements:
        ops[ms.point.phase][ms.point.op] = ms
    return r, ops, path


def total(ms):
    """count x cost: the per-step cost of one traced op."""
    return ms.point.cost * ms.point.count


def test_phases_from_the_capture_annotations(traced):
    r, ops, _ = traced
    ph = r.summary["phases"]
    assert ph["prefill"]["steps"] == ph["decode"]["steps"] == 1
    assert (ph["prefill"]["batch"], ph["prefill"]["context"]) == (1, T)      # from the SDPA shapes
    assert r.dtype == "fp32" and r.summary["time"]["kind"] == "cpu"


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_every_gemm_is_a_workload_linear_exactly(traced, phase):
    _, ops, _ = traced
    step = W.prefill(CFG, 1, T, **FP) if phase == "prefill" else W.decode(CFG, 1, T, **FP)
    linears = [o for o in step.ops if o.name.endswith("_proj") or o.name == "lm_head"]
    gemms = {k: m for k, m in ops[phase].items() if m.config["category"] == "gemm" and k.startswith("aten::mm")}
    # every traced mm costs what one of the workload's linear layers costs ...
    for k, m in gemms.items():
        assert any(m.point.cost == o.cost for o in linears), k
    # ... and per step they add up to all of them: q/k/v/o/gate/up/down x 2 layers + lm_head
    assert sum((total(m) for m in gemms.values()), ZERO) == sum((o.total for o in linears), ZERO)


def test_prefill_attention_residuals_and_kv_writes_are_exact(traced):
    _, ops, _ = traced
    step = W.prefill(CFG, 1, T, **FP)
    att = next(m for k, m in ops["prefill"].items() if k.startswith("aten::scaled_dot_product_attention"))
    # causal from SDPA's recorded is_causal: 4 x 1 x 4 x 16 x 8 x 8 / 2 FLOPs, q+o and K+V (once per KV head)
    assert att.point.cost == step.op("attention").cost and att.point.count == CFG.n_layers
    assert "causal" in att.point.op and "assumed" not in att.point.op
    res = ops["prefill"]["aten::add [8,64]x[8,64] fp32"]
    assert res.point.cost == step.op("attn_residual").cost == F.residual_add(T, 64, act_dtype="fp32")
    assert res.point.count == 2 * CFG.n_layers                                  # attn and mlp residuals
    kv = ops["prefill"]["aten::index_put_ [8,2,16] fp32->fp32"]                # k and v written separately
    assert total(kv) == step.op("kv_append").total


def test_decomposed_rmsnorm_costs_the_eps_add_and_its_intermediates(traced):
    _, ops, _ = traced
    p = ops["prefill"]
    parts = ["aten::pow [8,64] fp32", "aten::mean [8,64] fp32 dim[-1]", "aten::add [8,1] fp32",
             "aten::rsqrt [8,1] fp32", "aten::mul [8,64]x[8,1] fp32", "aten::mul [8,64]x[64] fp32"]
    per_norm = sum((p[k].point.cost for k in parts), ZERO)
    assert all(p[k].point.count == 2 * CFG.n_layers for k in parts)              # attn_norm and mlp_norm
    H = 64
    # FLOPs: square, sum, scale, weight = 4TH (the formula) + the eps add, one per row (T); rsqrt is not a FLOP
    assert per_norm.flops == F.rmsnorm(T, H).flops + T
    # bytes: pow 2TH, mean TH + T, add 2T, rsqrt 2T, x * r 2TH + T, * w 2TH + H (fp32): each intermediate
    # is written and read back; the fused formula reads x and w and writes y: 2TH + H
    assert per_norm.bytes == (7 * T * H + 6 * T + H) * 4
    assert per_norm.bytes - F.rmsnorm(T, H, act_dtype="fp32", weight_dtype="fp32").bytes == (5 * T * H + 6 * T) * 4


def test_decomposed_swiglu_has_the_formula_flops_and_one_more_round_trip(traced):
    _, ops, _ = traced
    silu, mul = ops["prefill"]["aten::silu [8,176] fp32"], ops["prefill"]["aten::mul [8,176]x[8,176] fp32"]
    both = silu.point.cost + mul.point.cost
    f = F.swiglu(T, 176, act_dtype="fp32")
    assert both.flops == f.flops                                  # SiLU 4 + the multiply 1 per element
    assert both.bytes - f.bytes == 2 * T * 176 * 4                # the SiLU output written and read back


def test_decomposed_rope_has_the_formula_flops_plus_rotate_halfs_negation(traced):
    _, ops, _ = traced
    p = ops["prefill"]
    E = {h: T * h * 16 for h in (4, 2)}                            # elements of q [8,4,16] and k [8,2,16]
    # x*cos and rotate_half(x)*sin share a signature (count 2 per layer for q, and for k), then their sum
    muls = sum(p[f"aten::mul [8,{h},16]x[8,1,16] fp32"].point.count for h in (4, 2))
    assert muls == 2 * 2 * CFG.n_layers
    per_layer = sum(p[f"aten::mul [8,{h},16]x[8,1,16] fp32"].point.cost.flops * 2
                    + p[f"aten::add [8,{h},16]x[8,{h},16] fp32"].point.cost.flops for h in (4, 2))
    assert per_layer == F.rope(T, 4, 2, 16).flops                 # 3 per element of q and k
    neg = sum(p[f"aten::neg [8,{h},8] fp32"].point.cost.flops for h in (4, 2))
    assert neg == (E[4] + E[2]) // 2                               # rotate_half negates half of each head


def test_decomposed_decode_attention_is_two_bmm_with_the_formula_flops(traced):
    _, ops, _ = traced
    d = ops["decode"]
    s = T + 1                                                      # keys after appending the new token
    bmm = [m for k, m in d.items() if k.startswith("aten::bmm")]
    assert len(bmm) == 2 and all(m.point.count == CFG.n_layers for m in bmm)
    both = sum((m.point.cost for m in bmm), ZERO)
    f = F.decode_attention(1, s, 4, 2, 16, act_dtype="fp32", kv_dtype="fp32")
    assert both.flops == f.flops                                   # q.k and p.v: 4 x B x Hq x S x D
    assert both.bytes - f.bytes == 2 * 1 * 4 * s * 4               # the scores written, then read back


def test_the_embedding_gather_is_uncosted_and_said_why(traced):
    r, ops, _ = traced
    emb = ops["prefill"]["aten::index [256,64]"]                   # table[ids]: the ids' shape is not recorded
    assert emb.flags == ("uncosted",) and emb.point.cost == ZERO
    s = r.summary      # the share is of measured time: under load any op can take most of it, so no bound on it
    assert 0 < s["uncosted_share"] < 1 and s["uncosted_share"] == pytest.approx(s["uncosted_s"] / s["attributed_s"])
    assert any(u["op"] == "aten::index [256,64]" for u in s["top_uncosted"])
    # what stays uncosted is only the gathers (values, not shapes, decide them) and a scalar compare
    assert {u["op"].split(" ")[0] for u in s["top_uncosted"]} <= {"aten::index", "aten::equal"}


def test_without_annotations_phases_are_inferred_from_tokens(traced):
    t = read_trace(traced[2])
    t.annotations = []                                             # as if recorded without phase markers
    r = analyze_trace(t)
    assert "inferred" in r.summary["phases"]["prefill"]["method"] and any("inferred" in n for n in r.notes)
    phase = {m.point.op: m.point.phase for m in r.measurements if m.config["category"] == "gemm"}
    # 8 rows per GEMM is the prompt, 1 row the decode step (the prompt's own lm_head, one row, counts as decode:
    # the price of inferring)
    assert {p for op, p in phase.items() if op.startswith("aten::mm [8,")} == {"prefill"}
    assert phase["aten::mm [1,64]x[64,64] fp32"] == "decode"
