"""The workload model against the seed and the issue's acceptance numbers."""

import pytest

from roofline import RooflineError, analyze_phase, decode, find_device, load_model, prefill, request_steps
from roofline.bounds import crossing, ridge_crossings
LLAMA_OPS = ["embedding", "attn_norm", "q_proj", "k_proj", "v_proj", "rope", "kv_append", "attention", "o_proj", "attn_residual", "mlp_norm", "gate_proj", "up_proj", "swiglu", "down_proj", "mlp_residual", "final_norm", "lm_head"]

L2 = load_model("llama-2-7b")
H100 = find_device("h100")


def test_h100_ridge_is_295():
    # 989e12 / 3.35e12 = 295.2 FLOP/byte
    assert H100.ridge("bf16") == pytest.approx(295, rel=0.01)
    # H200: 989e12 / 4.8e12 = 206
    assert find_device("h200").ridge("bf16") == pytest.approx(206, rel=0.01)


def test_request_steps():
    assert request_steps(4) == (1, 3)  # four tokens: one prefill, three decode steps
    assert request_steps(1) == (1, 0)  # prefill already predicts the only token
    with pytest.raises(RooflineError):
        request_steps(0)


def test_prefill_q_proj_flops():
    # 2 x 1,024 x 4,096 x 4,096 = 34,359,738,368
    assert prefill(L2, 1, 1024).op("q_proj").cost.flops == 34_359_738_368


def test_decode_kv_cache_read():
    # 2 (K,V) x 32 layers x 32 heads x 128 x 2 bytes x 1,024 tokens = 536,870,912
    assert decode(L2, 1, 1024).kv_cache_read_bytes == 536_870_912


def test_every_op_is_listed_with_layer_counts():
    ph = decode(L2, 1, 1024)
    assert [o.name for o in ph.ops] == LLAMA_OPS
    assert ph.op("q_proj").count == 32 and ph.op("lm_head").count == 1 and ph.op("embedding").count == 1
    assert ph.total == sum((o.cost * o.count for o in ph.ops), start=ph.ops[0].cost * 0)


def test_decode_linears_cross_between_300_and_400():
    assert analyze_phase(decode(L2, 1, 1024), H100).ops[2].bound == "memory"
    v512 = {o.name: o.bound for o in analyze_phase(decode(L2, 512, 1024), H100).ops}
    lin = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]
    assert all(v512[n] == "compute" for n in lin)
    x = ridge_crossings(L2, H100, "decode", context=1024)
    # q_proj: B / (1 + 2B/4096) = 295.2 -> B = 344.6, first integer 345
    assert x["q_proj"] == 345
    assert all(300 <= x[n] <= 400 for n in lin)
    assert x["attention"] is None  # decode attention never crosses: batching shares no KV


def test_prefill_q_proj_compute_bound():
    v = {o.name: o.bound for o in analyze_phase(prefill(L2, 1, 1024), H100).ops}
    assert v["q_proj"] == "compute"
    assert v["rope"] == "memory"


def test_gqa_kv_read_quarter():
    l3 = load_model("llama-3-8b")
    mha_like = l3.__class__(**{**l3.to_dict(), "n_kv_heads": 32})
    assert decode(l3, 1, 1000).kv_cache_read_bytes * 4 == decode(mha_like, 1, 1000).kv_cache_read_bytes


def test_cached_prefix_removes_work():
    full = prefill(L2, 1, 1024)
    cached = prefill(L2, 1, 1024, cached_tokens=1000)
    assert cached.new_tokens == 24
    assert cached.op("q_proj").cost.flops == 2 * 24 * 4096 * 4096
    assert cached.total.flops < full.total.flops / 20


def test_chunked_prefill_sums_chunks():
    ph = prefill(L2, 1, 1000, chunk=256)
    assert ph.chunks == (256, 256, 256, 232)
    # linear FLOPs are the same as unchunked; weights are read once per chunk (4x)
    un = prefill(L2, 1, 1000)
    assert ph.op("q_proj").cost.flops == un.op("q_proj").cost.flops
    w = 4096 * 4096 * 2
    assert ph.op("q_proj").cost.bytes - un.op("q_proj").cost.bytes == 3 * w
    # attention pairs: each chunk sees the chunks before it: sum(c*p + c*c/2) = 1000*1000/2 exactly
    assert ph.op("attention").cost.flops == pytest.approx(un.op("attention").cost.flops)


def test_lm_head_only_last_position_in_prefill():
    assert prefill(L2, 2, 512).op("lm_head").cost.flops == 2 * 2 * 4096 * 32000


@pytest.mark.parametrize("call, msg", [
    (lambda: prefill(L2, 0, 10), "batch must be at least 1"),
    (lambda: prefill(L2, 1, -5), "at least 1"),
    (lambda: prefill(L2, 1, 100, cached_tokens=100), "must be shorter than the prompt"),
    (lambda: prefill(L2, 1, 100, chunk=200), "larger than the prompt"),
    (lambda: prefill(L2, 1, 100, chunk=0), "at least 1"),
    (lambda: decode(L2, 1, 4096), "maximum context"),
    (lambda: load_model("gpt-17"), "Presets:"),
    (lambda: find_device("tpu-v9"), "Known devices"),
])
def test_bad_input_names_the_rule(call, msg):
    with pytest.raises(RooflineError, match=msg):
        call()


def test_crossing_bisection():
    assert crossing(lambda n: n, 10) == 10
    assert crossing(lambda n: 0, 10, limit=64) is None
