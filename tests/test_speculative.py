"""Speculative decoding on the roofline (issue 34): the formulas pinned by exact numbers, the verify step as a
workload, the draft's costs, the curve of `explain --spec` against hand-worked figures, one-line errors."""

import json
import math
from fractions import Fraction

import pytest
from click.testing import CliRunner

from profiler.cli import main
from roofline import formulas as F
from roofline import speculative as S
from roofline import workload as W
from roofline.cost import Cost
from roofline.devices import find_device
from roofline.errors import RooflineError
from roofline.explain import ExplainSpec
from roofline.models import PRESETS, load_model

LLAMA = PRESETS["llama-3-8b"]
H100 = find_device("h100")


def run(*args):
    return CliRunner().invoke(main, list(args))


# ---------------------------------------------------------------- formulas


def test_expected_tokens_is_exact_for_exact_inputs():
    # a = 0.8, k = 3: 1 + 0.8 + 0.64 + 0.512 = 2.952 = 369/125 exactly
    assert F.expected_tokens(Fraction(4, 5), 3) == Fraction(2952, 1000) == Fraction(369, 125)
    assert F.expected_tokens(0.8, 3) == pytest.approx(2.952, abs=1e-15)
    # (1 - 0.5^3) / (1 - 0.5) = 0.875 / 0.5 = 1.75 = 1 + 0.5 + 0.25
    assert F.expected_tokens(Fraction(1, 2), 2) == Fraction(7, 4)
    assert F.expected_tokens(1, 3) == 4 and F.expected_tokens(Fraction(1), 5) == 6      # a = 1: k + 1
    assert F.expected_tokens(0, 3) == 1                                                 # nothing accepted: 1
    for bad in ((0.8, 0), (0.8, 1.5), (0.8, True), (1.2, 3), (-0.1, 3), ("0.8", 3)):
        with pytest.raises(ValueError):
            F.expected_tokens(*bad)


def test_expected_tokens_from_rates_and_from_a_measured_histogram():
    # independent rates are the closed form
    assert F.expected_tokens_from_rates([Fraction(4, 5)] * 3) == Fraction(369, 125)
    # per-position rates 0.9, 0.5, 0.5: 1 + 0.9 + 0.45 + 0.225 = 2.575
    assert F.expected_tokens_from_rates([Fraction(9, 10), Fraction(1, 2), Fraction(1, 2)]) == Fraction(2575, 1000)
    # vLLM's counts: of 1,000 verify steps, 800 accepted draft 1, 640 draft 2, 512 draft 3:
    # 1 + (800 + 640 + 512) / 1,000 = 2.952, the independent a = 0.8 exactly
    assert F.expected_tokens_from_positions([800, 640, 512], 1000) == Fraction(369, 125)
    assert F.expected_tokens_from_positions([3, 1], 4) == Fraction(2)       # 1 + 4/4
    for counts, steps in (([5, 6], 10), ([11], 10), ([1], 0), ([], 10), ([-1], 10)):
        with pytest.raises(ValueError):
            F.expected_tokens_from_positions(counts, steps)


def test_rejection_sampling_cost():
    # B = 2, k = 3, V = 10: 20 elements per position; FLOPs 4 x 20 x (3 x 3 + 1) = 800 (softmax of 4 target and 3
    # draft rows, residual at 3); bytes 20 x (2 x 3 + 1) x 4 (fp32) = 560
    assert F.rejection_sampling(2, 3, 10) == Cost(800, 560)
    assert F.rejection_sampling(2, 3, 10, prob_dtype="bf16").bytes == 280


# ---------------------------------------------------------------- the verify step and the drafts


def test_verify_step_is_a_batch_of_k_plus_1_token_chunks_over_each_context():
    k, B, C = 3, 8, 1024
    v = S.verify_step(LLAMA, B, C, k)
    T = (k + 1) * B
    assert (v.phase, v.batch, v.new_tokens) == ("mixed", B, T)
    assert v.op("q_proj").cost == F.linear(T, 4096, 4096)                     # linears on (k + 1) x batch rows
    # attention: each sequence's 4 queries over 1,024 cached keys and causal among themselves, = a prefill chunk
    assert v.op("attention").cost == F.prefill_attention(B, k + 1, 32, 8, 128, cached_tokens=C)
    assert v.op("attention").cost.flops == 4 * B * 32 * 128 * (4 * 1024 + 4 * 4 / 2)
    assert v.op("lm_head").cost == F.lm_head(T, 4096, 128256)                 # logits at every position
    assert v.op("final_norm").cost == F.rmsnorm(T, 4096)
    assert v.op("embedding").cost == F.embedding(T, 4096)
    # the same as a prefill of 4 tokens after 1,024 cached, but for the logits of every position
    p = W.prefill(LLAMA, B, C + k + 1, cached_tokens=C)
    assert v.op("attention").cost == p.op("attention").cost and v.op("down_proj").cost == p.op("down_proj").cost
    assert p.op("lm_head").cost == F.lm_head(B, 4096, 128256)


def test_mtp_layer_is_one_routed_layer_with_its_own_kv_and_the_head():
    ds = PRESETS["deepseek-v3"]
    assert ds.mtp_layers == 1
    one = S.mtp_layer(ds)
    assert (one.n_layers, one.dense_layers, one.moe_layers, one.mtp_layers) == (1, (), (0,), 0)
    ph = W.decode(one, 4, 100)
    assert ph.op("experts").count == 1 and ph.op("lm_head").cost == W.decode(ds, 4, 100).op("lm_head").cost
    # its latent cache: one layer's 100 tokens x (512 + 64) x 2 bytes per sequence
    assert ph.kv_cache_read_bytes == 4 * 100 * (512 + 64) * 2
    norm, _, proj = S.mtp_projections(4, 7168)
    assert norm[1] == F.rmsnorm(4, 7168) and proj[1] == F.linear(4, 2 * 7168, 7168)
    with pytest.raises(RooflineError, match="llama-3-8b has none"):
        S.mtp_layer(LLAMA)


def test_a_draft_models_round_costs_its_k_decode_steps():
    spec = S.Speculation(3, 0.8, "model", PRESETS["small"])
    r = S.speculation_round(spec, LLAMA, H100, 4, 512, {})
    steps = [W.decode(PRESETS["small"], 4, 512 + i) for i in range(3)]
    assert r.draft_s == pytest.approx(sum(S.seconds(p, H100) for p in steps), rel=1e-12)
    assert r.draft_cost == sum((p.total for p in steps), Cost(0, 0))
    assert r.verify_s == S.seconds(S.verify_step(LLAMA, 4, 512, 3), H100)
    assert r.decode_s == S.seconds(W.decode(LLAMA, 4, 512), H100)
    assert r.speedup == pytest.approx(2.952 * r.decode_s / (r.draft_s + r.verify_s + r.reject_s), rel=1e-12)


@pytest.mark.parametrize("kw, says", [
    (dict(k=0, acceptance=0.8), "--spec (draft tokens per verify step) must be a whole number of at least 1"),
    (dict(k=3, acceptance=1.0), "from 0 up to (not including) 1"),
    (dict(k=3, acceptance=-0.5), "from 0 up to (not including) 1"),
    (dict(k=3, acceptance=0.5, draft="eagle"), "must be one of none, model, mtp"),
    (dict(k=3, acceptance=0.5, draft="model"), "a draft model goes with draft"),
])
def test_speculation_refuses_bad_settings_in_one_line(kw, says):
    with pytest.raises(RooflineError, match=None) as e:
        S.Speculation(**kw)
    assert says in str(e.value) and "\n" not in str(e.value)


# ---------------------------------------------------------------- `explain --spec`: the figures by hand
#
# llama-3-8b (H 4,096, I 14,336, 32 layers, 32 query / 8 KV heads of 128, vocab 128,256), bf16 everywhere, on
# the H100 SXM datasheet: 989 TFLOP/s bf16 (tensor ops), 67 TFLOP/s fp32 (vector ops), 3.35 TB/s. Each op below
# is written out from the formulas' definitions (2 FLOPs per multiply-add; each input read once, each output
# written once, weights once per step), one (FLOPs, bytes, tensor?) per op instance.

H, I, L, HQ, HKV, D, V = 4096, 14336, 32, 32, 8, 128, 128256
PEAK, PEAK32, BW = 989e12, 67e12, 3.35e12
LINEARS = ((H, HQ * D), (H, HKV * D), (H, HKV * D), (HQ * D, H), (H, I), (H, I), (I, H))   # q k v o gate up down


def _hand_ops(B, C, q):
    """Every op of a step where each of B sequences brings q new tokens over C cached ones (q = 1: decode; q =
    k + 1: the verify step), logits at every new position."""
    T = B * q
    layer = [(2 * T * K * N, K * N * 2 + T * (K + N) * 2, True) for K, N in LINEARS]
    layer += [(4 * T * H, 2 * T * H * 2 + H * 2, False)] * 2                         # attn_norm, mlp_norm
    layer += [(T * H, 3 * T * H * 2, False)] * 2                                     # the two residual adds
    layer += [(3 * T * (HQ + HKV) * D, 2 * T * (HQ + HKV) * D * 2 + T * D * 4, False),   # rope (fp32 tables)
              (0, 2 * (2 * T * HKV * D * 2), False),                                 # kv_append: read k, v; write
              (5 * T * I, 3 * T * I * 2, False)]                                     # swiglu
    pairs = q * C + q * q / 2                    # each query over the C cached keys, causal among the q (halved)
    if q == 1:
        pairs = C + 1                            # decode: one query over C + 1 keys, no halving
    layer.append((4 * B * HQ * D * pairs, 2 * B * q * HQ * D * 2 + 2 * B * (C + q) * HKV * D * 2, True))
    edge = [(0, T * H * 2 * 2 + 8 * T, False),                                       # embedding gather
            (4 * T * H, 2 * T * H * 2 + H * 2, False),                               # final norm
            (2 * T * H * V, H * V * 2 + T * (H + V) * 2, True)]                      # lm_head
    return layer * L + edge


def _hand_seconds(ops):
    return sum(max(f / (PEAK if tensor else PEAK32), b / BW) for f, b, tensor in ops)


def _hand_speedup(B, C, k=3, E=2.952):
    reject = max(4 * B * V * (3 * k + 1) / PEAK32, B * V * (2 * k + 1) * 4 / BW)
    return E * _hand_seconds(_hand_ops(B, C, 1)) / (_hand_seconds(_hand_ops(B, C, k + 1)) + reject)


def test_the_hand_op_list_is_the_workloads():
    for B, C, q in ((1, 1024, 1), (7, 1024, 4), (300, 128, 4)):
        hand = _hand_ops(B, C, q)
        ph = W.decode(LLAMA, B, C) if q == 1 else S.verify_step(LLAMA, B, C, q - 1)
        tot = ph.total
        assert sum(f for f, _, _ in hand) == pytest.approx(tot.flops, rel=1e-12)
        assert sum(b for _, b, _ in hand) == pytest.approx(tot.bytes, rel=1e-12)
        assert _hand_seconds(hand) == pytest.approx(S.seconds(ph, H100), rel=1e-12)


def _ridge_batch_by_hand(C, k=3):
    """The verify step's FLOPs are a x B and its bytes W0 + b x B (W0: the weights and norm vectors, read once a
    step), so its summed intensity a B / (W0 + b B) reaches the ridge R at B = R W0 / (a - R b)."""
    q = k + 1
    one, two = _hand_ops(1, C, q), _hand_ops(2, C, q)
    a = sum(f for f, _, _ in two) - sum(f for f, _, _ in one)
    b = sum(x for _, x, _ in two) - sum(x for _, x, _ in one)
    W0 = sum(x for _, x, _ in one) - b
    R = PEAK / BW
    return R * W0 / (a - R * b)


def _linear_crossing_batch(K, N, q=4):
    R = PEAK / BW
    return math.ceil(R / (1 - R * (K + N) / (K * N)) / q)


def test_explain_spec_llama_3_8b_on_h100_the_figures_by_hand():
    """The done-when check, context 1,024 (explain's default): the verify step's summed intensity reaches the
    ridge (295.2 FLOP/byte) at B = R W0 / (a - R b) = 566.3..., so batch 567; speculation with a draft not costed
    pays at every batch (a round stays under 2.952 decode steps: the 4 queries share each sequence's KV read)."""
    r = run("explain", "--model", "llama-3-8b", "--device", "h100", "--spec", "3", "--acceptance", "0.8")
    assert r.exit_code == 0, r.output
    hand = _ridge_batch_by_hand(1024)
    assert 566 < hand < 567
    assert "The verify step turns compute-bound at batch 567" in r.output
    assert "2.952 tokens per verify step" in r.output
    assert "Speculation pays at every batch up to 65,536 (of which 471 fit in memory)" in r.output
    assert all(_hand_speedup(b, 1024) > 1 for b in (1, 64, 471, 4096, 65536))
    d = json.loads(run("explain", "--model", "llama-3-8b", "--device", "h100", "--spec", "3", "--acceptance", "0.8",
                       "--json").output)
    assert [x["batch"] for x in d["rows"]] == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert (d["verify_ridge_batch"], d["stops_paying_batch"], d["max_batch"], d["notes"]) == (567, None, 471, [])
    assert d["tokens_per_step"] == pytest.approx(2.952, abs=1e-12)
    for x in d["rows"]:
        assert x["speedup"] == pytest.approx(_hand_speedup(x["batch"], 1024), rel=1e-9)
        assert x["spec_tokens_per_s_device"] == pytest.approx(x["batch"] * x["spec_tokens_per_s_user"], rel=1e-12)
        assert x["plain_tokens_per_s_user"] == pytest.approx(1 / x["decode_s"], rel=1e-12)
    # the batch from which most of the verify step's time is in compute-bound ops: a linear on T = 4B rows is at
    # the ridge where 2TKN / (2KN + 2T(K + N)) = R, T = R / (1 - R (K + N) / (KN)): gate, up and down from B = 82,
    # q and o from 87, k and v from 116, lm_head from 80. At context 1,024 the KV reads hold about half the step
    # until q and o join the MLP: 87. At context 128 (below) the MLP alone is most of it: 82.
    assert {n: _linear_crossing_batch(K, N) for n, (K, N) in
            {"q": (H, H), "k": (H, 1024), "down": (I, H), "gate": (H, I), "lm_head": (H, V)}.items()} == \
        {"q": 87, "k": 116, "down": 82, "gate": 82, "lm_head": 80}
    assert d["verify_compute_time_batch"] == 87


def test_explain_spec_at_a_short_context_stops_paying_where_the_hand_figures_say():
    """At context 128 the KV cache no longer hides the verify step's extra rows: past the ridge its linears cost
    compute for 4 x B rows while decode's still read their weights once, and the speedup falls below 1 at the
    first batch where E x t_decode < t_verify + t_reject, worked out op by op: 269."""
    first = next(b for b in range(1, 1024) if _hand_speedup(b, 128) < 1)
    assert first == 269
    assert _hand_speedup(268, 128) >= 1 > _hand_speedup(269, 128)
    assert 109 < _ridge_batch_by_hand(128) < 110
    d = json.loads(run("explain", "--model", "llama-3-8b", "--device", "h100", "--spec", "3", "--acceptance", "0.8",
                       "--context", "128", "--batch", "1,64,268,269", "--json").output)
    assert (d["verify_ridge_batch"], d["stops_paying_batch"], d["verify_compute_time_batch"]) == (110, 269, 82)
    assert [x["batch"] for x in d["rows"]] == [1, 64, 268, 269]
    assert [x["speedup"] >= 1 for x in d["rows"]] == [True, True, True, False]
    text = run("explain", "--model", "llama-3-8b", "--device", "h100", "--spec", "3", "--acceptance", "0.8",
               "--context", "128").output
    assert "Speculation stops paying at batch 269: from there a round costs more than 2.952 decode steps" in text
    assert "The verify step turns compute-bound at batch 110" in text


@pytest.mark.parametrize("extra, says", [
    (["--spec", "0", "--acceptance", "0.8"], "--spec (draft tokens per verify step) must be a whole number of at "
                                             "least 1"),
    (["--spec", "3", "--acceptance", "1"], "--acceptance must be a number from 0 up to (not including) 1"),
    (["--spec", "3", "--acceptance", "1.5"], "--acceptance must be a number from 0 up to (not including) 1"),
    (["--spec", "3", "--acceptance", "-0.1"], "--acceptance must be a number from 0 up to (not including) 1"),
    (["--spec", "3"], "needs --spec K (draft tokens per verify step, at least 1) and --acceptance A"),
    (["--acceptance", "0.5"], "needs --spec K"),
    (["--spec", "3", "--acceptance", "0.5", "--mtp", "--draft", "small"], "--draft and --mtp both name the draft"),
    (["--spec", "3", "--acceptance", "0.5", "--mtp"], "--mtp needs multi-token-prediction layers, but llama-3-8b has "
                                                      "none"),
    (["--spec", "3", "--acceptance", "0.5", "--draft", "nope-7b"], "Unknown model 'nope-7b'"),
    (["--spec", "3", "--acceptance", "0.5", "--tp", "2"], "--spec prices decode rounds on one device: drop --tp"),
    (["--spec", "3", "--acceptance", "0.5", "--batch", "4,0"], "batch must be at least 1"),
    (["--batch", "1,8"], "--batch takes one number for a step (1,8 was given); a list goes with --spec K"),
    (["--batch", "x"], "give a whole number of sequences"),
])
def test_explain_spec_refuses_bad_input_in_one_line(extra, says):
    r = run("explain", "--model", "llama-3-8b", "--device", "h100", *extra)
    assert r.exit_code != 0 and says in r.output, r.output
    assert "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1


def test_explain_spec_with_a_draft_model_and_with_mtp(tmp_path):
    draft = tmp_path / "config.json"       # Llama-3.2-1B's published sizes: a common draft for Llama-3-8B
    draft.write_text(json.dumps({"model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192,
                                 "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
                                 "head_dim": 64, "vocab_size": 128256, "max_position_embeddings": 131072,
                                 "rope_theta": 500000.0, "tie_word_embeddings": True}))
    d = json.loads(run("explain", "--model", "llama-3-8b", "--device", "h100", "--spec", "3", "--acceptance", "0.8",
                       "--draft", str(draft), "--batch", "1,256", "--json").output)
    dm = load_model(str(draft))
    for x in d["rows"]:
        steps = [W.decode(dm, x["batch"], 1024 + i) for i in range(3)]
        assert x["draft_s"] == pytest.approx(sum(S.seconds(p, H100) for p in steps), rel=1e-12)
    first = d["rows"][0]
    assert d["draft"] == "model" and first["speedup"] == pytest.approx(
        2.952 * first["decode_s"] / (first["draft_s"] + first["verify_s"] + first["reject_s"]), rel=1e-12)
    r = run("explain", "--model", "deepseek-v3", "--device", "h200", "--spec", "1", "--acceptance", "0.8", "--mtp",
            "--batch", "1")
    assert r.exit_code == 0, r.output
    assert "the model's multi-token-prediction layer (1 steps per round)" in r.output
    d = json.loads(run("explain", "--model", "deepseek-v3", "--device", "h200", "--spec", "1", "--acceptance", "0.8",
                       "--mtp", "--batch", "1", "--json").output)
    h200 = find_device("h200")
    layer = ExplainSpec(model=S.mtp_layer(PRESETS["deepseek-v3"]), device=h200)   # the checkpoint's FP8 blocks
    want = S.seconds(layer.decode_at(1), h200) + sum(max(c.flops / h200.peak(cdt), c.bytes / h200.bandwidth)
                                                     for _, c, cdt in S.mtp_projections(1, 7168))
    assert d["rows"][0]["draft_s"] == pytest.approx(want, rel=1e-12)
    # two tokens per sequence touch about twice the experts of one: at batch 1 the verify step reads far more
    # expert weights than a decode step, so the round costs more than the 1.8 tokens it yields
    assert d["tokens_per_step"] == pytest.approx(1.8) and d["stops_paying_batch"] is not None
    assert [n.split(" ")[:3] for n in d["notes"]] == [["latent", "attention's", "verify"], ["a", "verify", "step"]]
    assert "costed as a prefill chunk" in d["notes"][0] and "upper bound" in d["notes"][0]


# ---------------------------------------------------------------- diagnose: would speculation pay on the measured decode


def _decode_file(tmp_path, dev, batches, context=256):
    """Whole decode steps of `tiny` (its layer op) measured at 80% of their roof on ``dev``."""
    from roofline.bounds import roof_for
    from roofline.records import Measurement, RunHeader, WorkloadPoint, read_results
    from roofline.writer import ResultWriter

    tiny = PRESETS["tiny"]
    path = tmp_path / f"{dev.key}.jsonl"
    with ResultWriter(path, RunHeader(device=dev, model=tiny.to_dict(), kind="profile", settings={})) as w:
        for b in batches:
            c = W.decode(tiny, b, context).op("layer").cost
            t = roof_for(dev, "bf16", "bf16").predicted_s(c) / 0.8
            p = WorkloadPoint(model="tiny", op="layer", phase="decode", batch=b, new_tokens=1, context=context,
                              cost=c, compute_dtype="bf16")
            w.write(Measurement(point=p, times_s=(t, t, t), device=dev.name))
    return read_results(path)


def test_diagnose_says_where_speculation_would_pay_and_where_it_would_not(tmp_path):
    from roofline.devices import Device
    from roofline.verdicts.diagnosis import diagnose
    from roofline.verdicts.spec_rules import SPEC_ACCEPTANCE, break_even

    # break-even acceptance: E(a, 3) = 1 + a + a^2 + a^3 = the round's cost in decode steps
    assert break_even(1.0) == 0.0 and break_even(4.0) is None
    assert break_even(2.952) == pytest.approx(0.8, abs=1e-8) and break_even(1.75, k=2) == pytest.approx(0.5, abs=1e-8)
    # a ridge of 100 FLOP/B: tiny's decode (intensity <= 4) is memory-bound with headroom at every batch
    toy = Device(key="toy", name="toy", kind="gpu", peak_flops={"bf16": 100e12, "fp32": 10e12}, bandwidth=1e12)
    found = {f.rule: f for f in diagnose([_decode_file(tmp_path, toy, (1, 8, 64))])}
    assert "speculation-does-not-pay" not in found
    f = found["speculation-pays"]
    assert f.claim.startswith("Speculative decoding would pay on decode at b1/ctx256, b8/ctx256, b64/ctx256")
    tiny = PRESETS["tiny"]
    for step in f.data["steps"]:
        b = int(step["where"][1:].split("/")[0])
        ratio = (S.seconds(S.verify_step(tiny, b, 256, 3), toy)
                 + max(4 * b * 256 * 10 / 10e12, b * 256 * 7 * 4 / 1e12)) / S.seconds(W.decode(tiny, b, 256), toy)
        assert step["round_decode_steps"] == pytest.approx(ratio, rel=1e-12)
        assert F.expected_tokens(step["break_even_acceptance"], 3) == pytest.approx(ratio, rel=1e-7)
        assert step["break_even_acceptance"] <= SPEC_ACCEPTANCE
    assert "82.0x headroom" in f.evidence and "--spec 3 --acceptance A --draft MODEL" in f.action
    # a ridge of 4: from batch 64 the verify step's 4 x 64 rows cost compute a decode step does not
    low = Device(key="low", name="low", kind="gpu", peak_flops={"bf16": 4e12, "fp32": 4e12}, bandwidth=1e12)
    found = {f.rule: f for f in diagnose([_decode_file(tmp_path, low, (1, 64, 256))])}
    assert found["speculation-pays"].claim.startswith("Speculative decoding would pay on decode at b1/ctx256:")
    no = found["speculation-does-not-pay"]
    assert no.claim.startswith("Speculative decoding would not pay on decode at b64/ctx256, b256/ctx256")
    assert [s["break_even_acceptance"] > SPEC_ACCEPTANCE for s in no.data["steps"]] == [True, True]
    assert "b256/ctx256: compute-bound" in no.evidence


def test_diagnose_is_silent_on_speculation_without_a_whole_decode_step(tmp_path):
    from roofline.devices import Device
    from roofline.records import Measurement, RunHeader, WorkloadPoint, read_results
    from roofline.verdicts.diagnosis import diagnose
    from roofline.writer import ResultWriter

    toy = Device(key="toy", name="toy", kind="gpu", peak_flops={"bf16": 100e12, "fp32": 10e12}, bandwidth=1e12)
    path = tmp_path / "one_op.jsonl"     # only q_proj measured: not the user's decode step
    with ResultWriter(path, RunHeader(device=toy, model=PRESETS["tiny"].to_dict(), kind="profile")) as w:
        p = WorkloadPoint(model="tiny", op="q_proj", phase="decode", batch=1, new_tokens=1, context=256,
                          cost=Cost(2e6, 2e6), compute_dtype="bf16")
        w.write(Measurement(point=p, times_s=(2.5e-6,) * 3, device="toy"))
    assert not [f for f in diagnose([read_results(path)]) if f.rule.startswith("speculation")]


def test_explain_linear_refuses_the_speculation_options():
    r = run("explain", "linear", "--tokens", "4", "--in", "64", "--out", "64", "--spec", "3", "--acceptance", "0.8")
    assert r.exit_code != 0 and "--spec, --acceptance, --draft, --mtp and --vs-context price a model's decode" in r.output
