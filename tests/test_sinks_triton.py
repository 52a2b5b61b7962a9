"""Attention sinks (GPT-OSS) in the Triton prefill and decode attention kernels, interpreted on the CPU.

p_j = exp(s_j - m) / (exp(sink_h - m) + sum_j exp(s_j - m)): the kernels against ``kernels.sinks`` (the torch
path, the reference) in fp32 and in float64, prefill and decode, GQA, with and without a sliding window, a
cached prefix, ragged decode lengths over several splits, sinks large positive (the output shrinks toward 0)
and large negative (plain attention). ``sinks=None`` is bit-identical to a sink of -inf (the flag adds no
arithmetic), and the triton backend's GPT-OSS model runs these kernels (not kernels.sinks) and still matches
transformers' logits.
"""

import pytest
import torch

import kernels  # noqa: F401  (sets TRITON_INTERPRET before triton loads)
from kernels import decode_attention as DA
from kernels import prefill_attention as PA
from kernels import sinks as SK
from kernels.check_result import rel_err

TOL = 1e-5          # fp32 kernel vs float64 reference, relative to the largest output


def rnd(g, *shape):
    return torch.randn(*shape, generator=g)


def nan(*shape):
    return torch.full(shape, float("nan"))


def sink_values(kind, H, g):
    if kind == "mixed":
        return rnd(g, H) * 2
    if kind == "big+":
        return torch.full((H,), 60.0)            # exp(60) dwarfs every score: the output is ~0
    if kind == "big-":
        return torch.full((H,), -30.0)           # exp(-30) vanishes: plain attention
    return torch.tensor([4.0, -4.0, 0.5, -25.0, 12.0, -1.0, 2.0, 0.0][:H])   # "spread"


def prefill_ref(q, kc, vc, slots, p, sinks, **kw):
    return SK.prefill_with_sinks(q.double(), kc.double(), vc.double(), slots, p, sinks=sinks.double(), **kw)


# (B, n, cached, Hq, Hkv, D, window, sinks, blocks)
PREFILL = [
    (2, 37, 0, 4, 2, 16, None, "mixed", dict(block_m=16, block_n=16)),    # GQA, n not a multiple of the tiles
    (1, 30, 11, 4, 1, 24, None, "spread", dict(block_m=16, block_n=16)),  # a cached prefix, D not 16k
    (2, 23, 29, 4, 2, 16, 5, "mixed", dict(block_m=16, block_n=16)),      # window smaller than a tile
    (1, 41, 13, 8, 2, 16, 20, "spread", dict(block_m=32, block_n=16)),    # window over several tiles
    (1, 19, 0, 2, 2, 16, None, "big+", dict(block_m=16, block_n=16)),
    (1, 19, 7, 2, 1, 16, 6, "big-", dict(block_m=16, block_n=16)),
]


@pytest.mark.parametrize("B,n,p,Hq,Hkv,D,W,kind,cfg", PREFILL)
def test_prefill_with_sinks_matches_the_torch_path(B, n, p, Hq, Hkv, D, W, kind, cfg):
    g = torch.Generator().manual_seed(n * 7 + p)
    kc, vc, q = rnd(g, 3, Hkv, 80, D), rnd(g, 3, Hkv, 80, D), rnd(g, B, n, Hq, D) * 2
    slots, sinks = torch.tensor([2, 0][:B]), sink_values(kind, Hq, g)
    o = PA.prefill_attention(q, kc, vc, slots, p, window=W, sinks=sinks, out=nan(B, n, Hq, D), **cfg)
    ref = prefill_ref(q, kc, vc, slots, p, sinks, window=W)
    assert o.shape == (B, n, Hq, D) and o.dtype == torch.float32
    torch_path = SK.prefill_with_sinks(q, kc, vc, slots, p, sinks=sinks, window=W)
    plain = PA.reference(q.double(), kc.double(), vc.double(), slots, p, window=W)
    if kind == "big+":     # every row's weights sum to ~e^-50 of the sink's: the output is ~0, not attention
        assert o.abs().max() < 1e-9 and ref.abs().max() < 1e-9 and plain.abs().max() > 0.1
        return
    assert rel_err(o, ref) < TOL
    assert rel_err(o, torch_path) < TOL
    if kind == "big-":     # the sink weighs e^-30: plain attention
        assert rel_err(o, plain) < TOL
    else:                  # the sinks change the answer
        assert rel_err(plain, ref) > 1e-2


def test_non_causal_prefill_with_sinks():
    g = torch.Generator().manual_seed(3)
    kc, vc, q = rnd(g, 1, 2, 40, 16), rnd(g, 1, 2, 40, 16), rnd(g, 1, 21, 4, 16)
    sinks, slots = sink_values("mixed", 4, g), torch.tensor([0])
    o = PA.prefill_attention(q, kc, vc, slots, 19, causal=False, sinks=sinks, block_m=16, block_n=16)
    assert rel_err(o, prefill_ref(q, kc, vc, slots, 19, sinks, causal=False)) < TOL


def test_a_sinks_row_that_sees_no_key_of_its_first_tiles():
    """Window 3 at position 60: the query tile starts at the window, not at key 0; with the sink as the
    starting max the masked columns weigh exp2(-inf) = 0 (no NaN), and a -inf sink weighs 0 too."""
    g = torch.Generator().manual_seed(5)
    kc, vc, q = rnd(g, 1, 1, 80, 16), rnd(g, 1, 1, 80, 16), rnd(g, 1, 5, 2, 16)
    slots = torch.tensor([0])
    for sinks in (torch.tensor([1.0, -2.0]), torch.tensor([float("-inf"), 0.0])):
        o = PA.prefill_attention(q, kc, vc, slots, 60, window=3, sinks=sinks, block_m=16, block_n=16)
        assert rel_err(o, prefill_ref(q, kc, vc, slots, 60, sinks, window=3)) < TOL


def decode_ref(q, kc, vc, lens, slots, sinks, **kw):
    return SK.decode_with_sinks(q.double(), kc.double(), vc.double(), lens, slots, sinks=sinks.double(), **kw)


# (lengths, Hq, Hkv, D, window, sinks, config)
DECODE = [
    ((50, 7), 4, 2, 16, None, "mixed", dict(splits=3, block_n=16)),       # ragged, several splits, GQA
    ((61, 33, 1), 8, 2, 24, None, "spread", dict(splits=4, block_n=16)),  # D not 16k, a one-key sequence
    ((70, 9), 4, 1, 16, 20, "mixed", dict(splits=2, block_n=16)),         # window over two splits
    ((45, 44), 2, 2, 16, 5, "spread", dict(splits=1, block_n=16)),        # one split
    ((40,), 4, 2, 16, None, "big+", dict(splits=3, block_n=16)),
    ((40, 12), 4, 2, 16, 9, "big-", dict(splits=3, block_n=16)),
]


@pytest.mark.parametrize("lens,Hq,Hkv,D,W,kind,cfg", DECODE)
def test_decode_with_sinks_matches_the_torch_path(lens, Hq, Hkv, D, W, kind, cfg):
    g = torch.Generator().manual_seed(sum(lens) + Hq)
    B = len(lens)
    kc, vc, q = rnd(g, 4, Hkv, 80, D), rnd(g, 4, Hkv, 80, D), rnd(g, B, Hq, D) * 2
    lengths, slots, sinks = torch.tensor(lens), torch.tensor([3, 0, 1][:B]), sink_values(kind, Hq, g)
    o = DA.decode_attention(q, kc, vc, lengths, slots, window=W, sinks=sinks, out=nan(B, Hq, D), **cfg)
    ref = decode_ref(q, kc, vc, lengths, slots, sinks, window=W)
    plain = DA.reference(q.double(), kc.double(), vc.double(), lengths, slots, window=W)
    assert o.shape == (B, Hq, D)
    if kind == "big+":
        assert o.abs().max() < 1e-9 and ref.abs().max() < 1e-9 and plain.abs().max() > 0.1
        return
    assert rel_err(o, ref) < TOL
    assert rel_err(o, SK.decode_with_sinks(q, kc, vc, lengths, slots, sinks=sinks, window=W)) < TOL
    if kind == "big-":
        assert rel_err(o, plain) < TOL
    else:
        assert rel_err(plain, ref) > 1e-2


def test_decode_with_sinks_of_an_empty_sequence_is_zero():
    g = torch.Generator().manual_seed(2)
    kc, vc, q = rnd(g, 2, 1, 40, 16), rnd(g, 2, 1, 40, 16), rnd(g, 2, 2, 16)
    o = DA.decode_attention(q, kc, vc, torch.tensor([0, 30]), torch.tensor([0, 1]), sinks=torch.tensor([3.0, -3.0]),
                            splits=2, block_n=16)
    assert torch.equal(o[0], torch.zeros(2, 16))
    ref = decode_ref(q[1:], kc, vc, torch.tensor([30]), torch.tensor([1]), torch.tensor([3.0, -3.0]))
    assert rel_err(o[1:], ref) < TOL


def test_bf16_inputs_and_sinks_in_the_models_dtype():
    """A bf16 model passes its sinks in bf16: loaded and upcast in the kernel, as the torch path upcasts them."""
    g = torch.Generator().manual_seed(9)
    kc, vc = rnd(g, 1, 2, 48, 16).bfloat16(), rnd(g, 1, 2, 48, 16).bfloat16()
    sinks, slots = sink_values("mixed", 4, g).bfloat16(), torch.tensor([0])
    q = rnd(g, 1, 33, 4, 16).bfloat16()
    o = PA.prefill_attention(q, kc, vc, slots, 0, sinks=sinks, block_m=16, block_n=16)
    assert o.dtype == torch.bfloat16
    assert rel_err(o, prefill_ref(q, kc, vc, slots, 0, sinks.float())) < 1e-2     # bf16 output rounding
    qd = rnd(g, 1, 4, 16).bfloat16()
    od = DA.decode_attention(qd, kc, vc, torch.tensor([48]), slots, sinks=sinks, splits=3, block_n=16)
    assert rel_err(od, decode_ref(qd, kc, vc, torch.tensor([48]), slots, sinks.float())) < 1e-2


@pytest.mark.parametrize("W", [None, 7])
def test_sinks_none_is_bit_identical_to_a_sink_of_minus_infinity(W):
    """None compiles the kernels without the sink; a -inf sink runs the SINKS code and weighs exactly 0. Equal
    bits mean the None variant is the kernel as it was: the same online softmax, nothing added."""
    g = torch.Generator().manual_seed(11)
    kc, vc, q = rnd(g, 2, 2, 64, 16), rnd(g, 2, 2, 64, 16), rnd(g, 2, 29, 4, 16) * 2
    slots, off = torch.tensor([1, 0]), torch.full((4,), float("-inf"))
    kw = dict(window=W, block_m=16, block_n=16)
    a = PA.prefill_attention(q, kc, vc, slots, 17, **kw)
    assert torch.equal(a, PA.prefill_attention(q, kc, vc, slots, 17, sinks=off, **kw))
    assert not torch.equal(a, PA.prefill_attention(q, kc, vc, slots, 17, sinks=torch.zeros(4), **kw))
    assert rel_err(a, PA.reference(q.double(), kc.double(), vc.double(), slots, 17, window=W)) < TOL
    qd, lens = q[:, 0], torch.tensor([60, 23])
    kw = dict(window=W, splits=3, block_n=16)
    d = DA.decode_attention(qd, kc, vc, lens, slots, **kw)
    assert torch.equal(d, DA.decode_attention(qd, kc, vc, lens, slots, sinks=off, **kw))
    assert rel_err(d, DA.reference(qd.double(), kc.double(), vc.double(), lens, slots, window=W)) < TOL


@pytest.mark.parametrize("bad,msg", [(torch.zeros(3), r"sinks must have shape \[4\]"),
                                     (torch.zeros(4, dtype=torch.int32), "sinks must have a dtype in"),
                                     (torch.zeros(4, 1), r"sinks must have shape \[4\]"),
                                     ([0.0] * 4, "sinks must be a torch.Tensor")])
def test_bad_sinks_are_refused_by_name(bad, msg):
    q, kc = torch.zeros(1, 3, 4, 16), torch.zeros(1, 2, 8, 16)
    with pytest.raises(ValueError, match=msg):
        PA.prefill_attention(q, kc, kc, torch.tensor([0]), 0, sinks=bad)
    with pytest.raises(ValueError, match=msg):
        DA.decode_attention(q[:, 0], kc, kc, torch.tensor([3]), torch.tensor([0]), sinks=bad)


# ---- the model and the runners route GPT-OSS attention to the kernels on the triton backend --------------------

def _no_torch_sink_path(monkeypatch):
    from kernels import model as M
    from kernels import runner_context as R

    def refuse(*a, **k):
        raise AssertionError("the triton backend ran the torch sink path (kernels.sinks)")

    for mod in (M, R):
        monkeypatch.setattr(mod, "prefill_with_sinks", refuse)
        monkeypatch.setattr(mod, "decode_with_sinks", refuse)


def test_gpt_oss_triton_backend_runs_the_sink_kernels_and_matches_transformers(monkeypatch):
    import hf_tiny_moe as H
    import numpy as np

    from kernels.model import LlamaModel
    from roofline.models import load_model

    H.require("gpt_oss")
    folder, ref = H.checkpoint("gpt_oss"), H.reference("gpt_oss")
    cfg = load_model(folder)
    assert cfg.attn_sinks and any(cfg.windows) and not all(cfg.windows)     # sliding and full layers
    _no_torch_sink_path(monkeypatch)
    seq = torch.tensor(ref.sequence)
    m = LlamaModel(cfg, dtype="fp32", backend="triton", max_slots=3, max_len=len(seq) + 2)

    def close(ours, theirs):
        ours, theirs = np.asarray(ours.detach(), dtype=np.float64), np.asarray(theirs, dtype=np.float64)
        assert np.abs(ours - theirs).max() / np.abs(theirs).max() < 1e-4

    close(m.prefill(seq[:10], 0), ref.decode[9])                 # 10 tokens: past the window of 8
    close(m.decode_step(seq[10:11], [0])[0], ref.decode[10])
    close(m.decode_step(seq[11:12], [0])[0], ref.decode[11])


def test_gpt_oss_runners_say_which_sink_path_runs(monkeypatch):
    import hf_tiny_moe as H

    from kernels.runners import make_runners
    from roofline.models import load_model

    H.require("gpt_oss")
    cfg = load_model(H.checkpoint("gpt_oss"))
    out = {}
    for backend in ("torch", "triton"):
        for phase in ("prefill", "decode"):
            rs = {r.name: r for r in make_runners(cfg, phase, 2, 12, dtype="fp32", backend=backend,
                                                  ops=["attention", "attention_sliding"])}
            assert set(rs) == {"attention", "attention_sliding"}
            out[backend, phase] = {n: (r.config, r.fn()) for n, r in rs.items()}
    for phase in ("prefill", "decode"):
        for name in ("attention", "attention_sliding"):
            (tcfg, tri), (ccfg, tor) = out["triton", phase][name], out["torch", phase][name]
            assert tcfg["sinks"] == "Triton kernel" and ccfg["sinks"] == "torch path (kernels.sinks)"
            assert "block_n" in tcfg and "block_n" not in ccfg           # the kernel's own config is recorded
            assert tri.shape == tor.shape and rel_err(tri, tor) < TOL    # same inputs, same weights
    assert out["triton", "prefill"]["attention_sliding"][0]["window"] == H.WINDOW


def test_the_compile_check_records_the_sink_variants_beside_their_twins():
    """``kernels.compile_launches.sink_launches`` (on the quick set's Llama shapes) launches prefill attention and the
    decode merge with SINKS on, with and without a window; decode's split kernel never takes the sink."""
    from kernels import compile_launches as CL
    from kernels._launch import kernel_name, recording
    from roofline.models import load_model

    cfg = load_model("llama-3-8b")
    with recording(132) as rec:
        for phase in ("prefill", "decode"):
            CL.sink_launches(rec, {}, cfg, phase, 2, 128, torch.bfloat16)
    flags = {}
    for ln in rec.launches:
        c = ln.constexprs
        flags.setdefault(kernel_name(ln.kernel), set()).add(tuple(c.get(k) for k in ("WINDOW", "SINKS") if k in c))
    assert flags == {"_prefill_attn_kernel": {(False, True), (True, True)}, "_decode_split_kernel": {(False,), (True,)},
                     "_decode_merge_kernel": {(True,)}}
    sinks = [ln.args[5] for ln in rec.launches if kernel_name(ln.kernel) == "_prefill_attn_kernel"]
    assert all(s.shape == (cfg.n_heads,) and s.dtype == torch.bfloat16 for s in sinks)
