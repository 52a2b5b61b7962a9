"""The op-kind registry (issue 28): a kind registered from this file (no package file edited) is costed by a
Phase as soon as the model's ops use it; an unknown kind is refused in one line; the registry's kinds are the
layer's. Exact numbers, the arithmetic beside each."""

import pytest

from roofline import RooflineError, decode, load_model, prefill
from roofline import layer
from roofline import workload as W
from roofline.cost import Cost
from roofline.op_spec import OpSpec
from roofline.ops import KINDS, OpKind, kind, register

TINY = load_model("tiny")          # hidden 64, 2 layers
WIDTH = 64
SEEN = []                          # (rows, batch, chunk, cached, decode, tp) of every context the toy cost saw


def _toy_cost(op, s):              # 3 FLOPs per row and feature; 10 bytes per key of every sequence
    SEEN.append((s.rows, s.batch, s.chunk, s.cached, s.decode, s.tp))
    return Cost(3 * s.rows * op.dims["width"], 10 * s.batch * (s.cached + s.chunk))


def _toy_edge(op, s):              # 1 FLOP per row; 2 bytes per sequence and feature
    return Cost(s.rows, 2 * s.batch * op.dims["width"])


def _toy_weights(op, s):           # 100 bytes per feature, read once per chunk
    return 100 * op.dims["width"]


TOY = OpKind("toy_scan", "mlp", _toy_cost, _toy_edge, _toy_weights, tensor=True)
EDGE_ONLY = OpKind("toy_edge_only", "head", edge_cost=_toy_edge)


@pytest.fixture
def toy(monkeypatch):
    """The toy kinds registered, and the tiny model's ops with one per-layer toy op and one after the layers."""
    register(TOY)
    register(EDGE_ONLY)
    real = W.model_ops
    extra = [OpSpec("toy", "toy_scan", "layer", "mlp", TINY.n_layers, (), {"width": WIDTH}, (0, 1))]

    def ops(cfg, sh=None):
        base = real(cfg, sh)
        return base[:-2] + tuple(extra) + base[-2:] + (OpSpec("toy_tail", "toy_scan", "post", "head", 1, (),
                                                             {"width": WIDTH}),)

    monkeypatch.setattr(W, "model_ops", ops)
    SEEN.clear()
    yield extra
    KINDS.pop("toy_scan")
    KINDS.pop("toy_edge_only")


def test_a_registered_kind_is_costed_by_prefill_over_its_chunks(toy):
    ph = prefill(TINY, 2, 100, cached_tokens=20, chunk=32)   # 80 new tokens: chunks 32, 32, 16 after 20, 52, 84
    assert SEEN == [(64, 2, 32, 20, False, 1), (64, 2, 32, 52, False, 1), (32, 2, 16, 84, False, 1)]
    t = ph.op("toy")
    # FLOPs 3 x 64 x (64 + 64 + 32) rows = 30,720; bytes 10 x 2 x (52 + 84 + 100) keys = 4,720
    assert (t.cost, t.count, t.compute_dtype) == (Cost(30_720, 4_720), 2, "bf16")
    tail = ph.op("toy_tail")
    # edge: 2 x 80 = 160 rows, 2 x 2 x 64 = 256 bytes; once per step, at the act dtype (tensor=True)
    assert (tail.cost, tail.count, tail.compute_dtype) == (Cost(160, 256), 1, "bf16")


def test_the_phase_totals_and_weights_include_the_new_kind(toy, monkeypatch):
    ph = prefill(TINY, 2, 100, cached_tokens=20, chunk=32)
    with monkeypatch.context() as m:    # the same step without the toy ops (a Phase reads model_ops lazily)
        m.setattr(W, "model_ops", layer.model_ops)
        base = prefill(TINY, 2, 100, cached_tokens=20, chunk=32)
        base_layer, base_weights = base.layer_cost, base.weight_bytes
    # total: + 2 layers x (30,720, 4,720) + the tail (160, 256)
    assert ph.total.flops == base.total.flops + 61_440 + 160
    assert ph.total.bytes == base.total.bytes + 9_440 + 256
    # one layer on average: + 30,720 FLOPs
    assert ph.layer_cost.flops * 2 == base_layer.flops * 2 + 61_440
    # weights: 6,400 bytes per chunk x 3 chunks x 2 layers = 38,400, + 6,400 once for the tail
    assert ph.weight_bytes == base_weights + 44_800
    assert ph.expert_weight_bytes == 0 and ph.experts_touched == 0


def test_a_registered_kind_is_costed_by_decode_and_under_tp(toy):
    ph = decode(TINY, 3, 40)
    assert SEEN == [(3, 3, 1, 40, True, 1)]
    # FLOPs 3 x 3 x 64 = 576; bytes 10 x 3 x 41 = 1,230; the tail 3 rows, 2 x 3 x 64 = 384 bytes
    assert ph.op("toy").cost == Cost(576, 1_230) and ph.op("toy_tail").cost == Cost(3, 384)
    SEEN.clear()
    decode(TINY, 3, 40, tp=2)
    assert SEEN == [(3, 3, 1, 40, True, 2)]


def test_a_kind_without_a_per_layer_cost_is_refused_in_one_line(toy):
    toy[0] = OpSpec("toy", "toy_edge_only", "layer", "mlp", TINY.n_layers, (), {"width": WIDTH}, (0, 1))
    with pytest.raises(RooflineError, match="^op 'toy' of kind 'toy_edge_only' has no per-layer cost$"):
        decode(TINY, 1, 8)


def test_an_unknown_kind_is_refused_naming_the_registered_ones(toy):
    toy[0] = OpSpec("toy", "no_such_kind", "layer", "mlp", TINY.n_layers, (), {"width": WIDTH}, (0, 1))
    with pytest.raises(RooflineError) as e:
        decode(TINY, 1, 8)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("unknown op kind 'no_such_kind': the registered kinds are ")
    assert all(k in msg for k in ("linear", "attention", "experts", "toy_scan"))


def test_a_kind_is_registered_once(toy):
    with pytest.raises(RooflineError, match="'toy_scan' is already registered"):
        register(TOY)
    assert kind("toy_scan") is TOY


def test_the_registry_holds_the_layer_kinds_and_their_tensor_flags():
    assert set(KINDS) == {"embedding", "scale", "norm", "linear", "rope", "kv_append", "attention", "residual",
                          "activation", "softcap", "router", "experts", "gate", "mla_attention", "mla_up",
                          "latent_append", "conv1d", "delta_gates", "gated_delta", "gated_norm", "sigmoid_gate",
                          "layernorm", "index_append", "index_scores", "index_topk", "ssd_scan"}
    assert {k for k, v in KINDS.items() if v.tensor} == {"linear", "attention", "router", "experts", "mla_attention",
                                                         "mla_up", "gated_delta", "index_scores", "ssd_scan"}
    assert [k for k, v in KINDS.items() if v.linear] == ["linear"]
    assert [k for k, v in KINDS.items() if v.experts is not None] == ["experts"]
