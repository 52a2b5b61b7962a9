"""An SGLang decode step of Qwen3-8B (bf16, FlashInfer attention backend, ``--disable-cuda-graph``): 8 sequences at
4,096 keys. Names and layouts follow SGLang's sources (commit 01144484): the step span of ``build_step_span_name``
(``step[DECODE bs=8]``), sgl-kernel's ops (``sgl_kernel::fused_add_rmsnorm(input, residual, weight, eps,
enable_pdl)``, ``rmsnorm(output, input, weight, eps, enable_pdl)`` for the q/k norms over [T*H, D],
``apply_rope_pos_ids_cos_sin_cache(q, k, q_rope, k_rope, cos_sin_cache, pos_ids, interleave)``,
``silu_and_mul(out, input)``), the KV written by index_put_ (``set_kv_buffer``), FlashInfer's paged decode kernel
launched outside every op (its JIT module is not a torch op). Every kernel's FLOPs and bytes are worked by hand."""

import pytest

from roofline.models import PRESETS
from roofline.traces.analyze import analyze_trace
from roofline.traces.engine_steps import find_steps
from roofline.traces.events import read_trace

from engine_traces import BF, F32, I64, EngineTrace

M = PRESETS["qwen3-8b"]
T, H, HQ, HKV, D, I, V = 8, 4096, 32, 8, 128, 12288, 151936
CTX = 4096
MIX = f"decode={T}x{CTX}"
FLASHINFER = ("void flashinfer::BatchDecodeWithPagedKVCacheKernel<flashinfer::PosEncodingMode::kNone, 2u, 4u, 8u, "
              "16u, 1u, 8u, __nv_bfloat16, __nv_bfloat16, __nv_bfloat16, int>")
GEMV = "void gemv2T_kernel_val<int, int, __nv_bfloat16, __nv_bfloat16, float, 128, 16, 2, 4, false, false>"


def _norm(t, rows, width, us, add=False):
    name = "sgl_kernel::fused_add_rmsnorm" if add else "sgl_kernel::rmsnorm"
    t.op(name, [[rows, width], [rows, width], [width], [], []], [BF, BF, BF, "double", "bool"],
         ["", "", "", "1e-06", "False"], kernels=[("void flashinfer::norm::" + ("FusedAddRMSNormKernel" if add else
                                                                               "RMSNormKernel") + "<8u, bf16>", us)])


def build(tmp_path):
    t = EngineTrace()
    with t.step(f"step[DECODE bs={T}]"):
        t.op("aten::embedding", [[V, H], [T]], [BF, I64], kernels=[("void at::native::indexSelectSmallIndex", 2)])
        for _ in range(M.n_layers):
            _norm(t, T, H, 3, add=True)
            t.op("aten::mm", [[T, H], [H, 6144]], [BF, BF], kernels=[(GEMV, 16)])
            _norm(t, T * HQ, D, 2)
            _norm(t, T * HKV, D, 2)
            t.op("sgl_kernel::apply_rope_pos_ids_cos_sin_cache", [[T, HQ, D], [T, HKV, D], [T, HQ, D], [T, HKV, D],
                                                                  [40960, D], [T], []],
                 [BF, BF, BF, BF, F32, I64, "bool"], kernels=[("void flashinfer::BatchQKApplyRotaryPosIdsCosSinCache",
                                                              2)])
            for _kv in range(2):
                t.op("aten::index_put_", [[65536, HKV, D], [[T]], [T, HKV, D], []], [BF, "TensorList", BF, "bool"],
                     kernels=[("void at::native::index_elementwise_kernel<128, 4>", 2)])
            t.bare(FLASHINFER, 45)
            t.op("aten::mm", [[T, HQ * D], [HQ * D, H]], [BF, BF], kernels=[(GEMV, 11)])
            _norm(t, T, H, 3, add=True)
            t.op("aten::mm", [[T, H], [H, 2 * I]], [BF, BF], kernels=[(GEMV, 62)])
            t.op("sgl_kernel::silu_and_mul", [[T, I], [T, 2 * I]], [BF, BF],
                 kernels=[("void flashinfer::activation::act_and_mul_kernel<silu>", 2)])
            t.op("aten::mm", [[T, I], [I, H]], [BF, BF], kernels=[(GEMV, 31)])
        _norm(t, T, H, 3)
        t.op("aten::mm", [[T, H], [H, V]], [BF, BF], kernels=[(GEMV, 380)])
    return read_trace(t.dump(tmp_path / "sglang_qwen3_decode.json")), t.kernel_us


def mm(k, n):
    return 2 * T * k * n, T * k * 2 + k * n * 2 + T * n * 2


def rms(rows, width, add=False):
    return ((5 if add else 4) * rows * width, (4 if add else 2) * rows * width * 2 + width * 2)


HAND = {"add_norm": rms(T, H, add=True), "q_norm": rms(T * HQ, D), "k_norm": rms(T * HKV, D),
        "qkv": mm(H, 6144), "o": mm(HQ * D, H), "gate_up": mm(H, 2 * I), "down": mm(I, H),
        "rope": (3 * T * (HQ + HKV) * D, 2 * T * (HQ + HKV) * D * 2 + T * D * 4),
        "kv": (0, T * HKV * D * (2 + 2)),                  # one of k, v: read, and written into the cache
        "silu": (5 * T * I, 3 * T * I * 2),
        # 8 queries, each over its own 4,096 keys: K and V once per KV head, q and o
        "attn": (4 * T * HQ * CTX * D, 2 * T * CTX * HKV * D * 2 + 2 * T * HQ * D * 2)}
LAYER = ["add_norm", "qkv", "q_norm", "k_norm", "rope", "kv", "kv", "attn", "o", "add_norm", "gate_up", "silu", "down"]
HEAD_TAIL = [(0, T * H * 2 + T * H * 2 + T * 8), rms(T, H), mm(H, V)]


def test_the_sglang_step_span_is_a_decode_step_of_8(tmp_path):
    tr, _ = build(tmp_path)
    s, = find_steps(tr, MIX).steps
    assert (s.engine, s.mode, s.decode_requests, s.prefill_requests, s.tokens) == ("sglang", "decode", 8, 0, 8)
    assert s.mix.decodes == ((8, 4096),)


def test_every_kernel_of_the_sglang_decode_costs_what_the_hand_says_and_95_percent_is_costed(tmp_path):
    tr, kernel_us = build(tmp_path)
    r = analyze_trace(tr, model=M, mix=MIX)
    inst = sorted(r.instances, key=lambda i: i.t)
    head, layers, tail = inst[0], inst[1:-2], inst[-2:]
    assert len(layers) == M.n_layers * len(LAYER)
    for n, i in enumerate(layers):
        assert (i.cost.flops, i.cost.bytes) == pytest.approx(HAND[LAYER[n % len(LAYER)]], rel=1e-12), (n, i.name)
    for i, want in zip((head, *tail), HEAD_TAIL):
        assert (i.cost.flops, i.cost.bytes) == pytest.approx(want, rel=1e-12), i.name
    att = layers[LAYER.index("attn")]
    assert att.category == "attention" and att.name == FLASHINFER[:80] and att.signature == (
        "decode=8x4096 h32/8 d128 kv bf16")
    s = r.summary
    assert s["attributed_s"] == pytest.approx(kernel_us * 1e-6, rel=1e-9)
    assert s["uncosted_s"] == 0 and 1 - s["uncosted_share"] >= 0.95
    plain = analyze_trace(tr, model=M).summary              # no mix: FlashInfer's 36 launches are uncosted
    assert plain["uncosted_s"] == pytest.approx(36 * 45e-6, rel=1e-9)
