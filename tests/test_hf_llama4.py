"""Llama-4's text model (issue 31): its tiny checkpoint (tests/hf_tiny_moe.py's ``llama4_text``: layers 0-1 RoPE
over chunks of 6 positions with the weightless qk-norm, layer 2 NoPE over everything with the query temperature
(floor_scale 4), layer 0 a dense MLP of intermediate_size_mlp 96, layers 1-2 four experts of 32 (top-2, sigmoid
weights on the experts' inputs) + a shared expert of 32) against transformers.

- logits within 1e-4 of transformers' largest (fp32): prefill then decode past two chunk starts, the uncached
  forward, chunked prefill and prefix reuse, on the torch backend and the Triton kernels (interpreted); each
  Llama-4 feature switched off in our config moves them past the tolerance (the test can fail);
- the chunked mask in both backends' prefill and decode attention kernels against a brute-force loop;
- parameters equal transformers' on the meta device; prefill FLOPs equal FlopCounterMode's (its experts run
  every token through every expert, E / k times ours; its attention multiplies the whole score matrix);
- the reader: transformers' derivations (interleave_moe_layer_step, no_rope_layer_interval, layer_types), the
  published configs' ``attn_temperature_tuning: 4``, refusals in one line;
- the KV cache, the keys a step reads and the attention cost of chunked layers, counted by hand.

Llama-4 is not in hf_tiny_moe.MODEL_TYPES: the shared MoE FLOP harness (tests/hf_flops_moe.py) counts routed work
from the routers' (logits, weights, ids) and Llama4Router returns (scores, logits).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

import hf_tiny_moe as H
from kernels import decode_attention as DA
from kernels import prefill_attention as PA
from kernels.model import LlamaModel
from roofline import formulas as F
from roofline import workload as W
from roofline.capacity import kv_bytes
from roofline.errors import RooflineError
from roofline.layer import model_params, op_names, op_spec
from roofline.models import ModelConfig, load_model

MT = "llama4_text"
TOL = 1e-4
CHUNK = 6
transformers = pytest.importorskip("transformers")


def err(ours, theirs) -> float:
    ours = np.asarray(ours.detach() if isinstance(ours, torch.Tensor) else ours, dtype=np.float64)
    return float(np.abs(ours - theirs).max() / np.abs(theirs).max())


def close(ours, theirs):
    e = err(ours, theirs)
    assert e < TOL, f"max |ours - transformers| = {e:.2e} of the largest logit"


@pytest.fixture(scope="module")
def built():
    H.require(MT)
    return H.checkpoint(MT), H.reference(MT)


def _model(cfg, n, backend="torch"):
    return LlamaModel(cfg, dtype="fp32", backend=backend, max_slots=3, max_len=n + 2)


def test_the_reader_finds_every_feature(built):
    cfg = load_model(built[0])
    assert cfg.arch == MT and cfg.notes == ()
    assert (cfg.layer_types, cfg.attention_chunk, cfg.chunks, cfg.nope_layers) == (
        ("chunked", "chunked", "full"), CHUNK, (CHUNK, CHUNK, 0), (2,))
    assert (cfg.qk_l2_norm, cfg.attn_temperature, cfg.rope_interleave) == (True, (4, 0.5), True)
    assert (cfg.n_experts, cfg.n_active, cfg.moe_layers, cfg.dense_layers) == (4, 2, (1, 2), (0,))
    assert (cfg.intermediate, cfg.moe_intermediate, cfg.shared_intermediate) == (96, 32, 32)
    assert (cfg.router, cfg.norm_topk, cfg.routed_input) == ("sigmoid_topk", False, True)
    names = op_names(cfg)
    assert {"attention", "attention_chunked", "attn_temperature", "q_norm", "k_norm", "router", "experts",
            "shared_gate_proj", "gate_proj"} <= set(names)
    assert names.index("rope") < names.index("q_norm")          # the qk-norm comes after RoPE
    assert op_spec(cfg, "q_norm").weights == () and op_spec(cfg, "q_norm").layers == (0, 1)
    assert op_spec(cfg, "attention_chunked").dims["chunk"] == CHUNK and op_spec(cfg, "attention").layers == (2,)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_logits_match_transformers(built, backend):
    folder, ref = built
    seq = torch.tensor(ref.sequence)
    n = len(seq)
    assert n == 20 > 3 * CHUNK                     # decode crosses two chunk starts (6, 12, 18)
    m = _model(load_model(folder), n, backend)
    assert m.weights_info["weights"] == "checkpoint"
    close(m.prefill(seq[: ref.prompt], 0), ref.decode[ref.prompt - 1])
    for pos in range(ref.prompt, n):
        close(m.decode_step(seq[pos: pos + 1], [0])[0], ref.decode[pos])
    close(m.forward_full(seq[None]), ref.prefill)
    for start in range(0, n - 4, 4):               # chunked prefill: 4-token chunks across the 6-position chunks
        m.prefill(seq[start: start + 4], 1, logits=False)
    close(m.prefill(seq[start + 4:], 1), ref.prefill[n - 1])
    close(m.prefill_with_prefix(seq, 2, 1, n - 7), ref.prefill[n - 1])   # a prefix ending mid-chunk (13)


@pytest.mark.parametrize("off", [dict(attention_chunk=0, layer_types=()), dict(attn_temperature=()),
                                 dict(qk_l2_norm=False), dict(routed_input=False), dict(rope_interleave=False)],
                         ids=["chunk", "temperature", "qk_norm", "routed_input", "rope_interleave"])
def test_each_feature_moves_the_logits(built, off):
    from dataclasses import replace

    folder, ref = built
    seq = torch.tensor(ref.sequence)
    m = _model(replace(load_model(folder), **off), len(seq))
    assert err(m.forward_full(seq[None]), ref.prefill) > 10 * TOL


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("cached, n, chunk", [(0, 23, 8), (5, 23, 8), (13, 7, 8), (9, 30, 5), (0, 33, 64)])
def test_prefill_attention_masks_each_querys_chunk(backend, cached, n, chunk):
    g = torch.Generator().manual_seed(cached * 100 + n)
    kc, vc = torch.randn(2, 2, 48, 16, generator=g), torch.randn(2, 2, 48, 16, generator=g)
    q = torch.randn(1, n, 4, 16, generator=g)
    slots = torch.tensor([1])
    fn = PA.prefill_attention if backend == "triton" else PA.sdpa
    o = fn(q, kc, vc, slots, cached, chunk=chunk).double()
    k, v = kc[1].double().repeat_interleave(2, 0), vc[1].double().repeat_interleave(2, 0)
    brute = torch.zeros_like(o)
    for i in range(n):                                  # query at cached + i: keys from its chunk's start on
        p = cached + i
        lo = p // chunk * chunk
        s = (k[:, lo: p + 1] @ q[0, i].double()[:, :, None])[..., 0] / 4.0
        brute[0, i] = (s.softmax(-1)[:, None, :] @ v[:, lo: p + 1])[:, 0]
    assert float((o - brute).abs().max()) < 1e-5
    assert torch.allclose(PA.reference(q.double(), kc.double(), vc.double(), slots, cached, chunk=chunk), brute)


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("lens, chunk", [([1, 8, 9, 17, 40], 8), ([5, 33], 16), ([20, 48], 64)])
def test_decode_attention_masks_each_querys_chunk(backend, lens, chunk):
    g = torch.Generator().manual_seed(sum(lens))
    kc, vc = torch.randn(2, 2, 48, 16, generator=g), torch.randn(2, 2, 48, 16, generator=g)
    q = torch.randn(len(lens), 4, 16, generator=g)
    ln, sl = torch.tensor(lens), torch.tensor([i % 2 for i in range(len(lens))])
    fn = DA.decode_attention if backend == "triton" else DA.torch_decode
    o = fn(q, kc, vc, ln, sl, max_len=max(lens), chunk=chunk).double()
    for b, n in enumerate(lens):                        # the query at n - 1: keys ((n - 1) // C) * C .. n - 1
        lo = (n - 1) // chunk * chunk
        k = kc[b % 2, :, lo:n].double().repeat_interleave(2, 0)
        v = vc[b % 2, :, lo:n].double().repeat_interleave(2, 0)
        s = (k @ q[b].double()[:, :, None])[..., 0] / 4.0
        assert float((o[b] - (s.softmax(-1)[:, None, :] @ v)[:, 0]).abs().max()) < 1e-5


def test_parameter_count_equals_transformers_on_the_meta_device(tmp_path):
    cfg = H.tiny_config(MT)
    cfg.save_pretrained(tmp_path)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    assert model_params(load_model(tmp_path)) == sum(p.numel() for p in model.parameters())


def _hf_flops(folder, seq_len: int) -> dict:
    """FlopCounterMode over transformers' prefill (batch 1, the last position's logits), by module kind."""
    from torch.utils.flop_counter import FlopCounterMode

    import hf_tiny

    with hf_tiny.one_thread(), torch.no_grad():
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                                  attn_implementation="eager").eval()
        counter = FlopCounterMode(display=False)
        with counter:
            model(input_ids=torch.tensor([hf_tiny.tokens(seq_len)]), use_cache=False, logits_to_keep=1)
    counts = {name: sum(ops.values()) for name, ops in counter.get_flop_counts().items()}
    root = type(model).__name__
    got = dict.fromkeys(("linear", "experts", "router"), 0)
    attention = []
    for f, mod in model.named_modules():
        c = counts.get(f"{root}.{f}", 0)
        kind = type(mod).__name__
        if kind == "Llama4TextExperts":
            got["experts"] += c
        elif kind == "Llama4Router":
            got["router"] += c
        elif isinstance(mod, torch.nn.Linear):
            got["linear"] += c
        elif kind == "Llama4TextAttention":
            inner = sum(counts.get(f"{root}.{f}.{g}", 0) for g, s in mod.named_modules() if g)
            attention.append(c - inner)
    got["attention_layers"] = attention
    got["total"] = counts["Global"]
    return got


def test_prefill_flops_equal_flopcountermode(built):
    folder = built[0]
    S, E, k = 32, 4, 2
    cfg = load_model(folder)
    theirs = _hf_flops(folder, S)
    assert theirs["total"] == sum(theirs[x] for x in ("linear", "experts", "router")) + sum(theirs["attention_layers"])
    ours = dict.fromkeys(("linear", "experts", "router", "attention"), 0.0)
    for op in W.prefill(cfg, 1, S, act_dtype="fp32").ops:
        spec = op_spec(cfg, op.name)
        d = spec.dims
        if spec.kind == "experts":       # the GEMMs FlopCounterMode sees (our formula adds the elementwise work)
            ours["experts"] += 2 * S * d["k"] * 3 * d["hidden"] * d["intermediate"] * op.count
        elif spec.kind == "router":
            ours["router"] += 2 * S * d["in_features"] * d["n_experts"] * op.count
        elif spec.kind in ("linear", "attention"):
            ours[spec.kind] += op.total.flops
    assert ours["linear"] == theirs["linear"]
    assert ours["router"] == theirs["router"]
    assert ours["experts"] == theirs["experts"] * k / E          # transformers runs every token through all E
    # eager attention multiplies the whole S x S matrix: 4 Hq S^2 D per layer; ours counts the pairs a query sees
    pairs = [F.chunk_pairs(S, 0, c) if c else F.causal_pairs(S) for c in cfg.chunks]
    assert ours["attention"] == pytest.approx(sum(a * p / S ** 2 for a, p in zip(theirs["attention_layers"], pairs)),
                                              rel=1e-12)
    assert theirs["attention_layers"] == [4 * 4 * S * S * 16] * 3


# ---- chunked layers' KV cache and attention cost, by hand ------------------------------------------------------

TINY = ModelConfig("tiny-llama4", 64, 96, 3, 4, 2, 256, 512, head_dim=16, arch=MT, attention_chunk=CHUNK,
                   layer_types=("chunked", "chunked", "full"), nope_layers=(2,))
PER_TOKEN_LAYER = 2 * 2 * 16 * 2          # K and V, 2 KV heads of 16, bf16: 128 bytes per token per layer


def test_chunked_layers_hold_at_most_their_chunk():
    # batch 3 at context 20: each chunked layer holds min(20, 6) (its peak: positions 0-5, 6-11, 12-17 each
    # filled their chunk before it was freed), the full layer all 20
    assert kv_bytes(TINY, 3, 20) == 3 * PER_TOKEN_LAYER * (6 + 6 + 20)
    assert kv_bytes(TINY, 3, 4) == 3 * PER_TOKEN_LAYER * (4 + 4 + 4)           # shorter than a chunk
    assert kv_bytes(TINY, 3, 20, windowed=False) == 3 * PER_TOKEN_LAYER * 60   # our model's full allocation


def test_a_chunked_layer_reads_its_current_chunk():
    ph = W.decode(TINY, 2, 20)                # the new token at position 20: keys 18, 19 of its chunk are cached
    assert ph.kv_cache_read_bytes == 2 * PER_TOKEN_LAYER * (2 + 2 + 20)
    att = {o.name: o for o in ph.ops}
    assert att["attention_chunked"].count == 2 and att["attention"].count == 1
    # decode: 3 keys (18, 19, 20) x 4 heads x 16 dims x 4 FLOPs x batch 2, per chunked layer
    assert att["attention_chunked"].total.flops == 2 * (4 * 4 * 3 * 16 * 2)
    assert att["attention"].total.flops == 4 * 4 * 21 * 16 * 2


def test_chunked_prefill_pairs_by_hand():
    # 20 tokens from empty over chunks of 6: three full chunks (18 each, by the halving convention) + 2 (2)
    assert F.chunk_pairs(20, 0, 6) == 3 * 6 * 6 / 2 + 2 * 2 / 2
    # 7 tokens after 10 cached: positions 10, 11 see 4 + themselves (2*4 + 2), then 12-16 start afresh (12.5)
    assert F.chunk_pairs(7, 10, 6) == (2 * 4 + 2 * 2 / 2) + 5 * 5 / 2
    c = F.prefill_attention(1, 7, 4, 2, 16, cached_tokens=10, chunk=6, act_dtype="fp32", kv_dtype="fp32")
    assert c.flops == 4 * 4 * 16 * F.chunk_pairs(7, 10, 6)
    # keys read: from the first query's chunk start (6): 4 cached + 7 new, K and V of 2 heads, + q and o
    assert c.bytes == 2 * 11 * 2 * 16 * 4 + 2 * 7 * 4 * 16 * 4
    assert F.decode_attention(1, 13, 4, 2, 16, chunk=6).flops == 4 * 4 * 1 * 16   # position 12 opens a chunk
    assert F.chunk_pairs(20, 0, None) == F.causal_pairs(20)


# ---- the reader ----------------------------------------------------------------------------------------------

SMALL = dict(model_type=MT, hidden_size=64, intermediate_size=32, intermediate_size_mlp=96, num_hidden_layers=8,
             num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=256, num_local_experts=4)


def _write(tmp_path, **kw):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({**SMALL, **kw}))
    return p


def test_transformers_derivations(tmp_path):
    m = load_model(_write(tmp_path, interleave_moe_layer_step=2))      # Maverick: every other layer routed
    assert (m.moe_layers, m.dense_layers, m.intermediate) == ((1, 3, 5, 7), (0, 2, 4, 6), 96)
    assert (m.nope_layers, m.chunks) == ((3, 7), (8192,) * 3 + (0,) + (8192,) * 3 + (0,))
    assert (m.attn_temperature, m.qk_l2_norm, m.n_active) == ((8192, 0.1), True, 1)
    m = load_model(_write(tmp_path, interleave_moe_layer_step=1))      # Scout: every layer routed
    assert m.dense_layers == () and m.intermediate == 32
    m = load_model(_write(tmp_path, attention_chunk_size=None, attn_temperature_tuning=False, use_qk_norm=False))
    assert (m.attention_chunk, m.layer_types, m.attn_temperature, m.qk_l2_norm) == (0, (), (), False)
    m = load_model(_write(tmp_path, layer_types=["chunked_attention"] * 8, no_rope_layers=[1] * 8))
    assert (m.layer_types, m.chunks, m.nope_layers, m.attn_temperature) == ((), (8192,) * 8, (), ())
    m = load_model(_write(tmp_path, attn_temperature_tuning=4, floor_scale=8192.0, rope_scaling={
        "factor": 16.0, "high_freq_factor": 1.0, "low_freq_factor": 1.0, "original_max_position_embeddings": 8192,
        "rope_type": "llama3"}, for_llm_compressor=False))
    assert m.attn_temperature == (8192, 0.1)                   # published configs say 4: transformers tests its truth
    assert any("rope_scaling" in n and "llama3" in n for n in m.notes)


@pytest.mark.parametrize("kw, says", [
    (dict(layer_types=["chunked_attention"] * 8, attention_chunk_size=None), "layer_types has chunked_attention "
     "layers but attention_chunk_size is null"),
    (dict(layer_types=["sliding_attention"] * 8), "layer_types = "),
    (dict(no_rope_layers=[1, 0]), "no_rope_layers has 2 entries for num_hidden_layers 8"),
    (dict(sliding_window=4096), "sliding_window = 4096 is not a field roofline knows for llama4_text"),
    (dict(attn_temperature_tuning="yes"), "attn_temperature_tuning = "),
    (dict(moe_layers="all"), "moe_layers = "),
])
def test_refusals_are_one_line(tmp_path, kw, says):
    with pytest.raises(RooflineError) as e:
        load_model(_write(tmp_path, **kw))
    assert "\n" not in str(e.value) and says in str(e.value), str(e.value)


def test_model_config_rules():
    with pytest.raises(RooflineError, match="chunked layers but attention_chunk is 0"):
        ModelConfig("x", 64, 96, 2, 4, 2, 256, 512, layer_types=("chunked", "full"))
    with pytest.raises(RooflineError, match="attention_chunk and sliding_window are both set"):
        ModelConfig("x", 64, 96, 2, 4, 2, 256, 512, attention_chunk=8, sliding_window=8)
    with pytest.raises(RooflineError, match="attn_temperature must be"):
        ModelConfig("x", 64, 96, 2, 4, 2, 256, 512, attn_temperature=(0, 0.1))
    back = ModelConfig.from_dict(json.loads(json.dumps(TINY.to_dict())))
    assert back == TINY and math.isclose(back.scale, 0.25)


def test_the_wrappers_checkpoint_runs_its_text_model(tmp_path):
    """A tiny Llama4ForConditionalGeneration as save_pretrained writes it (the text model under language_model.,
    its lm_head language_model.lm_head.weight, a vision tower we do not cost): text logits equal transformers'."""
    import hf_tiny

    text = dict(hidden_size=64, intermediate_size=32, intermediate_size_mlp=96, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, vocab_size=256, head_dim=16, num_local_experts=4,
                interleave_moe_layer_step=2, no_rope_layer_interval=2, attention_chunk_size=4, floor_scale=2,
                max_position_embeddings=64, rope_theta=10000.0)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14, vision_output_dim=32, projector_input_dim=32, projector_output_dim=32)
    cfg = transformers.Llama4Config(text_config=text, vision_config=vision)
    ids = hf_tiny.tokens(11)
    with hf_tiny.one_thread(), torch.no_grad():
        torch.manual_seed(0)
        model = transformers.AutoModelForImageTextToText.from_config(cfg, attn_implementation="eager").float().eval()
        hf_tiny._randomize(model, MT, 0)          # hf_tiny_moe's spreads the routers through the forward: text-only
        g = torch.Generator().manual_seed(1)     # fails in the wrapper (below); decisive routers instead
        for name, p in model.named_parameters():
            if name.endswith("router.weight"):
                p.copy_(torch.randn(p.shape, generator=g) * H.ROUTER_STD)
        model.save_pretrained(tmp_path)
        # the wrapper's own forward fails on text alone in 5.24 (its output lacks image_outputs): its language model
        theirs = model.language_model(input_ids=torch.tensor([ids])).logits[0].double().numpy()
    ours = LlamaModel(load_model(tmp_path), dtype="fp32", backend="torch", max_len=16)
    assert ours.weights_info["weights"] == "checkpoint"
    close(ours.forward_full(torch.tensor([ids])), theirs)
