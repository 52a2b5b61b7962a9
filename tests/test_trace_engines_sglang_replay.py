"""An SGLang decode step of Qwen3-8B replayed from its CUDA graph, with no capture trace: 8 sequences at 4,096 keys
(bf16, FlashInfer backend, graph for bs=8). The replay's kernels carry no op and no shapes; the layer-position
rule (``roofline.traces.rules.layer_position``) sizes them from their place in Qwen3-8B's layer and the step
annotation's batch.

Names and order follow SGLang's sources: ``CudaGraphRunner.replay`` copies the step's inputs into the graph's
static buffers (eager ``copy_`` ops), then one ``cudaGraphLaunch`` replays the forward captured in
``Qwen3ForCausalLM.forward`` (``models/qwen3.py``, commit 01b5f572): the embedding gather; per layer the input
RMSNorm (plain in layer 0, ``fused_add_rmsnorm`` after: ``layer_boundary``'s ``previous=None`` for layer 0),
``qkv_proj`` (one GEMM), ``apply_qk_norm`` (``models/utils.py``, commit a0e6a9ad: the unfused path, taken where
``fused_inplace_qknorm`` is not eligible, e.g. deterministic inference: q's norm on the current stream, k's on
``alt_stream`` while capturing, so here k's kernel starts first, on stream 8), the rope, ``set_kv_buffer``'s k and
v copies (v on the alternate stream), FlashInfer's paged decode, ``o_proj``, ``post_attention_layernorm`` (add
fused), ``gate_up_proj``, ``silu_and_mul``, ``down_proj``; the final norm (add fused) and the lm_head (the logits
processor runs in the graph). The step span is ``build_step_span_name``'s ``step[DECODE bs=8]``. cuBLAS picks the
GEMV for every linear: one kernel name for five GEMM shapes.

Every kernel's FLOPs and bytes below are worked by hand (T = 8 tokens, H = 4,096, 32 q heads and 8 KV heads of
128, I = 12,288, V = 151,936, bf16: 2 bytes).
"""

import pytest

from roofline.models import PRESETS
from roofline.traces.analyze import analyze_trace
from roofline.traces.events import read_trace

from engine_traces import EngineTrace, I32, I64

M = PRESETS["qwen3-8b"]
T, H, V, CTX = 8, 4096, 151936, 4096
MIX = f"decode={T}x{CTX}"
FLASHINFER = ("void flashinfer::BatchDecodeWithPagedKVCacheKernel<flashinfer::PosEncodingMode::kNone, 2u, 4u, 8u, "
              "16u, 1u, 8u, __nv_bfloat16, __nv_bfloat16, __nv_bfloat16, int>")
GEMV = "void gemv2T_kernel_val<int, int, __nv_bfloat16, __nv_bfloat16, float, 128, 16, 2, 4, false, false>"
NORM = "void flashinfer::norm::RMSNormKernel<8u, __nv_bfloat16>"
ADD_NORM = "void flashinfer::norm::FusedAddRMSNormKernel<8u, __nv_bfloat16>"
ROPE = "void flashinfer::BatchQKApplyRotaryPosIdsCosSinCacheKernel<true, 128u, 8u, 16u, __nv_bfloat16, long>"
INDEX = "void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<...>>"
EMBED = "void at::native::(anonymous namespace)::indexSelectSmallIndex<c10::BFloat16, long, unsigned int, 2, 2, -2>"
SILU = "void flashinfer::activation::act_and_mul_kernel<__nv_bfloat16, &silu>"
COPY = "void at::native::vectorized_elementwise_kernel<4, at::native::direct_copy_kernel_cuda>"

# (FLOPs, bytes) by hand
HAND = {
    "embed": (0, 131_136),                     # 8 rows of 4,096 read + written (65,536 each), 8 int64 ids (64)
    "norm": (131_072, 139_264),                # [8,4096]: 4 per element; x read, y written, the weight (8,192)
    "add_norm": (163_840, 270_336),            # 5 per element; x, r read, h, y written (4 x 65,536) + 8,192
    "qkv": (402_653_184, 50_495_488),          # 2*8*4096*6144; x 65,536 + W 50,331,648 + out 98,304
    "q_norm": (131_072, 131_328),              # [256,128]: 32,768 elements x 4; 2 x 65,536 + the weight (256)
    "k_norm": (32_768, 33_024),                # [64,128]: 8,192 x 4; 2 x 16,384 + 256
    "rope": (122_880, 167_936),                # 3 per element of q, k (8*40*128); read+write 163,840, cos/sin 4,096
    "kv": (0, 32_768),                         # k (or v) [8,8,128]: read 16,384, written into the cache 16,384
    "attn": (536_870_912, 134_348_800),        # 4*8*32*4096*128; K, V once per KV head 134,217,728, q, o 131,072
    "o": (268_435_456, 33_685_504),            # 2*8*4096*4096; 65,536 + 33,554,432 + 65,536
    "gate_up": (1_610_612_736, 201_785_344),   # 2*8*4096*24576; 65,536 + 201,326,592 + 393,216
    "silu": (491_520, 589_824),                # 5*8*12288; read [8,24576], write [8,12288]
    "down": (805_306_368, 100_925_440),        # 2*8*12288*4096; 196,608 + 100,663,296 + 65,536
    "lm_head": (9_957_277_696, 1_247_156_224),  # 2*8*4096*151936; 65,536 + 1,244,659,712 + 2,430,976
}
# a layer's kernels as replayed: (name, µs, stream, what)
LAYER = [(ADD_NORM, 3, 7, "add_norm"), (GEMV, 16, 7, "qkv"), (NORM, 2, 8, "k_norm"), (NORM, 2, 7, "q_norm"),
         (ROPE, 2, 7, "rope"), (INDEX, 2, 7, "kv"), (INDEX, 2, 8, "kv"), (FLASHINFER, 45, 7, "attn"),
         (GEMV, 11, 7, "o"), (ADD_NORM, 3, 7, "add_norm"), (GEMV, 62, 7, "gate_up"), (SILU, 2, 7, "silu"),
         (GEMV, 31, 7, "down")]


def replay_kernels(model=M):
    ks = [(EMBED, 2, 7, "embed")]
    for i in range(model.n_layers):
        ks += [(NORM, 3, 7, "norm")] + LAYER[1:] if i == 0 else LAYER
    return ks + [(ADD_NORM, 3, 7, "add_norm"), (GEMV, 380, 7, "lm_head")]


def build(tmp_path, kernels=None, step=f"step[DECODE bs={T}]"):
    t = EngineTrace()
    ks = replay_kernels() if kernels is None else kernels
    with t.step(step):
        for name, shape, dt in (("input_ids", [T], I64), ("positions", [T], I64), ("out_cache_loc", [T], I64),
                                ("seq_lens", [T], I32)):
            t.op("aten::copy_", [shape, shape, []], [dt, dt, "bool"], ["", "", "False"], kernels=[(COPY, 1)])
        t.graph([(n, us, s) for n, us, s, _ in ks])
    return read_trace(t.dump(tmp_path / "sglang_qwen3_replay.json")), t.kernel_us, ks


def _replayed(r):
    return sorted((i for i in r.instances if i.graph is not None), key=lambda i: i.t)


def test_every_replayed_kernel_is_sized_by_its_place_in_the_layer_and_the_step_is_costed_to_95_percent(tmp_path):
    tr, kernel_us, ks = build(tmp_path)
    r = analyze_trace(tr, model=M, mix=MIX)
    inst = _replayed(r)
    assert len(inst) == len(ks) == 1 + 36 * 13 + 2
    for n, (i, (_, us, _, what)) in enumerate(zip(inst, ks)):
        assert (i.cost.flops, i.cost.bytes) == pytest.approx(HAND[what], rel=1e-12), (n, what, i.name)
        assert i.seconds == pytest.approx(us * 1e-6)
    gemms = [i for i in inst if i.category == "gemm"]
    assert len(gemms) == 36 * 4 + 1 and all("sized by position" in i.note for i in gemms)
    assert gemms[2].detail == {"m": 8, "k": 4096, "n": 24576, "batch": 1, "what": "layer 0 gate_proj+up_proj"}
    assert "step[DECODE bs=8]" in gemms[0].note and gemms[0].rule.endswith("layer_position.by_position")
    assert {i.category for i in inst if "kv" in i.detail.get("what", "")} == {"kv_write"}
    assert inst[0].category == "gather" and inst[-1].detail["what"] == "lm_head"
    s = r.summary
    assert s["attributed_s"] == pytest.approx(kernel_us * 1e-6, rel=1e-9)
    assert s["uncosted_s"] == 0 and 1 - s["uncosted_share"] >= 0.95
    assert s["phases"]["decode"]["steps"] == 1             # the eager input copies and the replay: one engine step
    # the five GEMM shapes of one GEMV kernel are five rows of the results, each with its own cost
    rows = {m.point.op: m for m in r.measurements if m.config["category"] == "gemm"}
    assert len(rows) == 5 and sorted(m.config["instances"] for m in rows.values()) == [1, 36, 36, 36, 36]


def test_the_k_norm_on_the_alternate_stream_is_k_whatever_its_order(tmp_path):
    tr, _, ks = build(tmp_path)
    inst = _replayed(analyze_trace(tr, model=M, mix=MIX))
    k, q = inst[1 + 2], inst[1 + 3]                   # layer 0: k's kernel (stream 8) started first
    assert (k.detail["what"], k.cost.flops) == ("layer 0 k_norm", 32_768)
    assert (q.detail["what"], q.cost.flops) == ("layer 0 q_norm", 131_072)


def test_a_replay_that_leaves_the_layer_pattern_is_left_uncosted_and_said(tmp_path):
    ks = replay_kernels()
    del ks[1 + 13 * 5 + 4]                            # layer 5 without its rope kernel
    tr, _, _ = build(tmp_path, ks)
    r = analyze_trace(tr, model=M, mix=MIX)
    inst = _replayed(r)
    assert all(i.cost is None for i in inst if i.category != "attention")     # nothing sized: never guessed
    assert sum(i.cost is not None for i in inst) == 36                       # the attention, by its own rule
    say, = [n for n in r.notes if "not sized by position" in n]
    assert "kernel 71 of 470 is 'void at::native::index_elementwise_kernel<128, 4, at::native' (copy) where " \
           "layer 5 rope (rope) should run" in say and "on qwen3-8b" in say


def test_another_models_layers_are_not_sized_as_this_one(tmp_path):
    tr, _, _ = build(tmp_path)
    r = analyze_trace(tr, model=PRESETS["llama-3-8b"], mix=MIX)       # no q/k norms: the fourth kernel differs
    assert all(i.cost is None for i in _replayed(r) if i.category != "attention")
    say, = [n for n in r.notes if "not sized by position" in n]
    assert "kernel 4 of 471 is 'void flashinfer::norm::RMSNormKernel<8u, __nv_bfloat16>' (norm) where layer 0 rope " \
           "(rope) should run" in say


def test_without_the_steps_tokens_or_the_model_nothing_is_sized(tmp_path):
    tr, _, _ = build(tmp_path, step="forward")
    r = analyze_trace(tr, model=M)
    assert all(i.cost is None for i in _replayed(r))
    assert any("no engine step annotation says its tokens" in n for n in r.notes)
    tr, _, _ = build(tmp_path)
    r = analyze_trace(tr)
    assert all(i.cost is None for i in _replayed(r)) and not any("by position" in n for n in r.notes)


QKNORM = "void flashinfer::norm::QKRMSNormKernel<8u, __nv_bfloat16>"      # fused_inplace_qknorm: one kernel, q and k
STORE = "void store_kvcache_kernel<__nv_bfloat16>"                         # one kernel writes k and v


def test_the_fused_qk_norm_and_a_one_kernel_kv_store_are_sized_as_one_kernel_each(tmp_path):
    ks = []
    for k in replay_kernels():
        if k[3] == "k_norm" or (k[3] == "kv" and k[2] == 8):
            continue                                  # k's norm and v's copy are in the kernel before them
        ks.append((QKNORM, 3, 7, "qk_norm") if k[3] == "q_norm" else (STORE, 3, 7, "kv_store") if k[3] == "kv"
                  else k)
    tr, kernel_us, _ = build(tmp_path, ks)
    r = analyze_trace(tr, model=M, mix=MIX)
    hand = {**HAND, "qk_norm": (163_840, 164_352),   # q's 131,072 + k's 32,768 FLOPs; 131,328 + 33,024 bytes
            "kv_store": (0, 65_536)}                  # k and v [8,8,128] read (32,768) and written into the cache
    inst = _replayed(r)
    assert len(inst) == len(ks) == 1 + 36 * 11 + 2
    for i, (_, _, _, what) in zip(inst, ks):
        assert (i.cost.flops, i.cost.bytes) == pytest.approx(hand[what], rel=1e-12), what
    assert {i.category for i in inst if i.name.startswith("void store_kv")} == {"kv_write"}
    assert r.summary["uncosted_s"] == 0
