"""MLA kernels (issue 21): the absorbed Triton decode against its fp32 reference and torch peer, against
transformers' DeepseekV3Attention (naive form), the naive torch prefill, configs, costs and input errors."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from kernels import mla as M
from kernels._launch import recording
from kernels.backend import get_ops
from roofline import formulas as F

# DeepSeek-V3's rank 512 / rope 64 shrunk to 32 / 16 (the interpreter runs every program serially)
R, P = 32, 16


def _inputs(B, H, S, L, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *shape: torch.randn(*shape, generator=g).to(dtype)   # noqa: E731
    return mk(B, H, R), mk(B, H, P), mk(S, L, R), mk(S, L, P)


def _err(a, b):
    return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp(min=1e-30))


@pytest.mark.parametrize("H", [5, 20])          # not powers of two; 20 > BLOCK_H 16: two head blocks
def test_decode_ragged_lengths_match_reference(H):
    ql, qp, ckv, kpe = _inputs(4, H, 5, 70)
    lengths, slots = torch.tensor([1, 37, 70, 16]), torch.tensor([2, 0, 4, 1])   # a length of 1, one full
    ref = M.reference(ql, qp, ckv, kpe, lengths, slots, sm_scale=0.15)
    for cfg in ({}, dict(splits=1), dict(splits=3, block_n=16)):
        out = torch.full_like(ql, float("nan"))
        o = M.mla_decode(ql, qp, ckv, kpe, lengths, slots, sm_scale=0.15, max_len=70, out=out, **cfg)
        assert o is out and o.shape == (4, H, R)
        assert _err(o, ref) < 1e-5, cfg
    assert _err(M.torch_decode(ql, qp, ckv, kpe, lengths, slots, sm_scale=0.15), ref) < 1e-5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_decode_16_bit(dtype):
    ql, qp, ckv, kpe = _inputs(2, 3, 2, 40, dtype)
    lengths, slots = torch.tensor([40, 9]), torch.tensor([1, 0])
    ref = M.reference(ql, qp, ckv, kpe, lengths, slots, sm_scale=0.1)
    o = M.mla_decode(ql, qp, ckv, kpe, lengths, slots, sm_scale=0.1)
    assert o.dtype == dtype and _err(o, ref) < 2e-2
    assert _err(M.torch_decode(ql, qp, ckv, kpe, lengths, slots, sm_scale=0.1), ref) < 2e-2


def test_decode_length_zero_gives_zeros_and_single_key_copies_it():
    ql, qp, ckv, kpe = _inputs(2, 3, 2, 8)
    o = M.mla_decode(ql, qp, ckv, kpe, torch.tensor([0, 1]), torch.tensor([0, 1]), sm_scale=0.2)
    assert torch.count_nonzero(o[0]) == 0
    # one key: the softmax is 1, so every head's output is that key's latent
    assert torch.allclose(o[1], ckv[1, 0].expand(3, R), atol=1e-6)
    assert torch.count_nonzero(M.torch_decode(ql, qp, ckv, kpe, torch.tensor([0, 1]), torch.tensor([0, 1]),
                                              sm_scale=0.2)[0]) == 0


def test_decode_input_errors_name_the_tensor():
    ql, qp, ckv, kpe = _inputs(2, 3, 2, 8)
    ln, sl = torch.tensor([3, 4]), torch.tensor([0, 1])
    with pytest.raises(ValueError, match="kpe_cache must have shape \\[2, 8, 16\\]"):
        M.mla_decode(ql, qp, ckv, kpe[:, :, :8], ln, sl, sm_scale=0.1)
    with pytest.raises(ValueError, match="exceed the cache length 8"):
        M.mla_decode(ql, qp, ckv, kpe, torch.tensor([9, 1]), sl, sm_scale=0.1)
    with pytest.raises(ValueError, match="q_pe must have dtype"):
        M.mla_decode(ql, qp.half(), ckv, kpe, ln, sl, sm_scale=0.1)
    with pytest.raises(ValueError, match="block_n must be a power of two"):
        M.mla_decode(ql, qp, ckv, kpe, ln, sl, sm_scale=0.1, block_n=24)


def test_config_for_deepseek_v3_on_132_sms():
    # H 128 / BLOCK_H 16 = 8 head blocks; batch 1, 4,096 keys: 4 x 132 / 8 = 66 -> 64 splits of 64 keys
    with recording(132):
        c = M.mla_decode_config(1, 128, 4096, "meta", dtype=torch.bfloat16)
    assert (c["head_blocks"], c["splits"], c["split_size"], c["block_n"], c["num_warps"]) == (8, 64, 64, 32, 4)
    # batch 64: 4 x 132 / 512 -> 2 splits; fp32: 16-key tiles and 8 warps
    with recording(132):
        c = M.mla_decode_config(64, 128, 4096, "meta", dtype=torch.float32)
    assert (c["splits"], c["block_n"], c["num_warps"], c["programs"]) == (2, 16, 8, 64 * 8 * 2)


def test_launch_grid_puts_head_blocks_of_a_sequence_side_by_side():
    meta = torch.device("meta")
    t = lambda *s: torch.empty(*s, dtype=torch.bfloat16, device=meta)   # noqa: E731
    with recording(132) as rec:
        M.mla_decode(t(2, 128, 512), t(2, 128, 64), t(2, 4097, 512), t(2, 4097, 64),
                     torch.empty(2, dtype=torch.int32, device=meta), torch.arange(2, device=meta), sm_scale=0.1,
                     max_len=4097)
    split, merge = rec.launches
    # 4 x 132 / 16 -> 33 splits of 128 keys; head blocks on axis 0 (fastest), then splits, then sequences
    assert split.grid == (8, 33, 2) and merge.grid == (2, 128, 1)
    assert (split.constexprs["BLOCK_R"], split.constexprs["BLOCK_P"], merge.constexprs["BLOCK_R"]) == (512, 64, 128)


def test_cost_and_flop_counter_agree():
    # torch_decode's matmuls, counted by torch: 2 x 2 x 4 x 24 x 48 (scores) + 2 x 2 x 4 x 24 x 32 (output)
    B, H, S = 2, 4, 24
    ql, qp, ckv, kpe = _inputs(B, H, B, S)
    with FlopCounterMode(display=False) as fc:
        M.torch_decode(ql, qp, ckv, kpe, torch.tensor([S, S]), torch.arange(B), sm_scale=0.1)
    c = M.cost(B, S, H, R, P, dtype=torch.float32)
    assert fc.get_total_flops() == c.flops == 2 * B * H * S * (R + P) + 2 * B * H * S * R == 18_432 + 12_288
    # fp32: latent 2 x 24 x 48 x 4 = 9,216; q 2 x 4 x 48 x 4 = 1,536; o 2 x 4 x 32 x 4 = 1,024
    assert c.bytes == 9_216 + 1_536 + 1_024


def test_backends_register_mla_decode():
    assert get_ops("triton").mla_decode is M.mla_decode and get_ops("torch").mla_decode is M.torch_decode
    assert get_ops("triton").mla_prefill is M.mla_prefill is get_ops("torch").mla_prefill


def test_prefill_torch_path_matches_reference_and_costs_naive():
    g = torch.Generator().manual_seed(1)
    B, n, c, H, QK, V = 2, 6, 5, 3, 24, 12            # q/k head dim nope 8 + rope 16, v 12
    q = torch.randn(B, n, H, QK, generator=g)
    k, v = torch.randn(B, c + n, H, QK, generator=g), torch.randn(B, c + n, H, V, generator=g)
    for cached, qq, kk, vv in ((c, q, k, v), (0, q, k[:, c:], v[:, c:])):
        o = M.mla_prefill(qq, kk, vv, sm_scale=0.2, cached=cached)
        assert o.shape == (B, n, H, V)
        assert _err(o, M.mla_prefill_reference(qq, kk, vv, sm_scale=0.2, cached=cached)) < 1e-5
    # the first query after 5 cached tokens sees 6 keys: changing key 6 leaves it unchanged
    k2 = k.clone()
    k2[:, 6] += 1
    assert torch.equal(M.mla_prefill(q, k2, v, sm_scale=0.2, cached=c)[:, 0], M.mla_prefill(q, k, v, sm_scale=0.2,
                                                                                              cached=c)[:, 0])
    with pytest.raises(ValueError, match="k must have shape"):
        M.mla_prefill(q, k[:, 1:], v, sm_scale=0.2, cached=c)
    assert M.prefill_cost(B, n, H, 8, 16, V, cached=c, kv_lora_rank=R) == F.mla_prefill_attention(
        B, n, H, 8, 16, V, cached_tokens=c, kv_lora_rank=R)


def test_absorbed_decode_and_naive_prefill_match_transformers_deepseek_v3():
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as DS

    torch.manual_seed(0)
    H, NOPE, V, T = 5, 8, 12, 9
    cfg = DeepseekV3Config(hidden_size=64, num_attention_heads=H, num_key_value_heads=H, q_lora_rank=24,
                           kv_lora_rank=R, qk_rope_head_dim=P, qk_nope_head_dim=NOPE, v_head_dim=V,
                           num_hidden_layers=1, vocab_size=100, intermediate_size=64, moe_intermediate_size=32)
    cfg._attn_implementation = "eager"
    att = DS.DeepseekV3Attention(cfg, 0).eval()
    x = torch.randn(1, T, 64)
    cos, sin = DS.DeepseekV3RotaryEmbedding(cfg)(x, torch.arange(T)[None])
    with torch.no_grad():
        want, _ = att(x, (cos, sin), torch.full((T, T), float("-inf")).triu(1)[None, None])   # [1, T, 64]
        q = att.q_b_proj(att.q_a_layernorm(att.q_a_proj(x))).view(1, T, H, NOPE + P).transpose(1, 2)
        q_nope, q_pe = q.split([NOPE, P], -1)
        ckv, kpe = att.kv_a_proj_with_mqa(x).split([R, P], -1)
        ckv = att.kv_a_layernorm(ckv)                                                  # the cached latent
        q_pe, kpe = DS.apply_rotary_pos_emb_interleave(q_pe, kpe.view(1, 1, T, P), cos, sin)
        w_uk, w_uv = M.split_kv_b(att.kv_b_proj.weight, H, NOPE, V)
        # absorbed decode of the last token over all T latents
        ql = M.absorb_query(q_nope[:, :, -1], w_uk).contiguous()
        o_lat = M.mla_decode(ql, q_pe[:, :, -1].contiguous(), ckv.contiguous(), kpe[:, 0].contiguous(),
                             torch.tensor([T]), torch.tensor([0]), sm_scale=att.scaling)
        got = att.o_proj(M.unabsorb_output(o_lat, w_uv).reshape(1, H * V))
        assert _err(got, want[:, -1]) < 1e-5
        # naive prefill of all T tokens: K, V up-projected from the latents
        kv = att.kv_b_proj(ckv).view(1, T, H, NOPE + V)
        k = torch.cat([kv[..., :NOPE], kpe[:, 0, :, None].expand(1, T, H, P)], -1)
        o = M.mla_prefill(torch.cat([q_nope, q_pe], -1).transpose(1, 2), k, kv[..., NOPE:].contiguous(),
                          sm_scale=att.scaling)
        assert _err(att.o_proj(o.reshape(1, T, H * V)), want) < 1e-5


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_roofline_check_covers_mla(backend):
    from kernels import check as C

    g = torch.Generator().manual_seed(5)
    rnd = lambda *s: torch.randn(*s, generator=g).to(torch.bfloat16)                   # noqa: E731
    nan = lambda *s: torch.full(s, float("nan"), dtype=torch.bfloat16)                # noqa: E731
    res = [C._result(n, C.rel_err(o, r), C.KERNEL_TOL["bf16"], d)
           for n, o, r, d in C._mla_checks(get_ops(backend), torch.device("cpu"), rnd, nan, backend == "triton", True)]
    assert [r.name.split()[0] for r in res] == ["mla_decode"] * 3 + ["mla_prefill"] * 2
    assert "lens=[37, 1, 0, 60] H=5" in res[0].name and "H=20" in res[1].name
    assert all(r.passed for r in res), [str(r) for r in res if not r.passed]


def test_compile_check_variants_cover_deepseek_v3_mla_decode():
    # the quick set's decode combos launch mla_decode at H 128, R 512, P 64 in bf16 and fp16 (not fp32)
    from kernels import variants as V

    launches = V.record(V.TARGETS["sm_90"], [("llama-2-7b", "decode", 1, 4096 - 1, "bf16"),
                                             ("llama-2-7b", "decode", 64, 128, "fp16"),
                                             ("llama-2-7b", "decode", 1, 128, "fp32")])
    mla = [ln for ln in launches if ln.context.get("op") == "mla_decode"]
    assert [(ln.name, ln.context["dtype"]) for ln in mla] == [
        ("_mla_decode_split_kernel", "bf16"), ("_mla_decode_merge_kernel", "bf16"),
        ("_mla_decode_split_kernel", "fp16"), ("_mla_decode_merge_kernel", "fp16")]
    split = mla[0]
    assert split.args[0].shape == (1, 128, 512) and split.constexprs["BLOCK_R"] == 512
    assert split.grid == (8, 64, 1) and mla[0].context["model"] == "deepseek-v3"
