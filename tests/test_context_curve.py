"""A hybrid's decode step against context beside its dense counterpart (issue 32): ``roofline.context_curve``, the
``explain --vs-context`` command and the report's decode-vs-context figure, on Qwen3-Next and DeepSeek-V3.2 as
transformers publishes them, shrunk to 4 layers (3 Gated DeltaNet + 1 full attention; 3 dense-MLP + 1 MoE, each
with an indexer) and a 262,144-token context. Bytes per kind are hand counts; the crossing contexts follow from
them in closed form (every op of these batch-1 steps is memory-bound, so a step's roof time is its bytes over the
bandwidth, and each step's bytes are affine in the context)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from profiler.cli import main
from roofline import workload as W
from roofline.bounds import analyze_phase
from roofline.context_curve import context_curve, context_curve_text, curve_contexts, dense_counterpart
from roofline.devices import find_device
from roofline.errors import RooflineError
from roofline.explain import ExplainSpec
from roofline.models import PRESETS, load_model
from roofline.records import RunHeader, read_results
from roofline.writer import ResultWriter

transformers = pytest.importorskip("transformers")

H100 = find_device("h100")
LONG = 262_144
KV_TOKEN = 2 * 2 * 256 * 2          # Qwen3-Next's full layer: K and V, 2 KV heads x 256, bf16: 2,048 B per token
STATE = 3 * (32 * 128 * 128 * 4 + (2 * 16 * 128 + 32 * 128) * 3 * 2)   # 3 layers: fp32 state + 3 conv inputs, bf16
# a DeltaNet layer's projections (in_proj_qkvz 2,048 -> 12,288, in_proj_ba -> 64, out_proj 4,096 -> 2,048) less an
# attention layer's (q and its gate 2,048 -> 8,192, k and v -> 512 each, o 4,096 -> 2,048), bf16, 3 layers
LINEAR_EXTRA = 3 * 2 * 2048 * ((12_288 + 64) - (8192 + 2 * 512))
LATENT = (512 + 64) * 2             # DeepSeek-V3.2's latent per token and layer, bf16
INDEX_KEY = 128 + 4                 # the indexer's fp8 key and its fp32 scale
# the indexer's projections per layer: wq_b 1,536 -> 64 x 128, wk 7,168 -> 128, the head weights 7,168 -> 64; bf16
INDEXER = 4 * 2 * (1536 * 8192 + 7168 * 128 + 7168 * 64)


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    p = tmp_path_factory.mktemp("qwen3-next")
    transformers.Qwen3NextConfig(num_hidden_layers=4, max_position_embeddings=LONG).save_pretrained(p)
    return load_model(str(p))


@pytest.fixture(scope="module")
def v32(tmp_path_factory):
    p = tmp_path_factory.mktemp("v32")
    transformers.DeepseekV32Config(num_hidden_layers=4, max_position_embeddings=LONG).save_pretrained(p)
    return load_model(str(p))


def _curve(m, contexts=(4096, 131_072), faster=2.0, batch=1):
    return context_curve(ExplainSpec(m, H100, batch=batch), faster, contexts)


# ---- the counterpart

def test_the_counterpart_is_the_same_config_with_dense_attention(qwen, v32):
    d = dense_counterpart(qwen)
    assert qwen.layer_types == ("linear", "linear", "linear", "full")
    assert d.layer_types == ("full",) * 4 and d.linear_layers == () and d.attention_layers == (0, 1, 2, 3)
    assert (d.linear_k_heads, d.linear_v_heads, d.linear_k_dim, d.linear_v_dim, d.linear_conv) == (0,) * 5
    same = ("hidden", "n_heads", "n_kv_heads", "head_dim", "attn_gate", "n_experts", "n_active", "moe_intermediate",
            "shared_intermediate", "vocab", "max_context")
    assert all(getattr(d, f) == getattr(qwen, f) for f in same)
    s = dense_counterpart(v32)
    assert (s.index_topk, s.index_n_heads, s.index_head_dim, s.index_layers) == (0, 0, 0, ())
    assert (s.kv_lora_rank, s.q_lora_rank, s.dense_layers) == (v32.kv_lora_rank, v32.q_lora_rank, v32.dense_layers)
    assert d.name == f"{qwen.name} (dense counterpart)"
    with pytest.raises(RooflineError) as e:
        dense_counterpart(PRESETS["llama-3-8b"])
    assert str(e.value) == ("llama-3-8b attends densely in every layer, so it has no dense counterpart to be compared "
                            "with: --vs-context takes a model with linear-attention layers (qwen3_next, qwen3_5), "
                            "Mamba-2 layers (nemotron_h, granitemoehybrid, falcon_h1) or sparse attention "
                            "(deepseek_v32, glm_moe_dsa).")


def test_the_contexts_are_powers_of_two_up_to_the_last_decode_step(qwen):
    assert curve_contexts(qwen) == tuple(1024 << i for i in range(8)) + (LONG - 1,)
    assert curve_contexts(PRESETS["tiny"]) == ()                      # 512 positions: no step at 1,024
    from dataclasses import replace
    assert curve_contexts(replace(qwen, max_context=32_768)) == (1024, 2048, 4096, 8192, 16_384, 32_767)


# ---- bytes by kind, by hand

def test_qwen3_next_bytes_by_kind_at_4096_and_131072_are_hand_counts(qwen):
    c = _curve(qwen)
    for h, d, ctx in zip(c.hybrid, c.dense, (4096, 131_072)):
        assert (h.context, d.context) == (ctx, ctx)
        assert h.kv_bytes == ctx * KV_TOKEN                            # one full-attention layer
        assert d.kv_bytes == 4 * ctx * KV_TOKEN                        # all four
        assert h.state_bytes == STATE == 6_438_912 and d.state_bytes == 0
        assert h.index_bytes == d.index_bytes == 0
        assert h.weight_bytes - d.weight_bytes == LINEAR_EXTRA == 38_535_168
    assert (c.hybrid[0].kv_bytes, c.hybrid[1].kv_bytes) == (8_388_608, 268_435_456)
    assert (c.dense[0].kv_bytes, c.dense[1].kv_bytes) == (33_554_432, 1_073_741_824)
    # between the two contexts only the KV read grows: 2,048 B per token for the model, 8,192 for its counterpart
    assert c.hybrid[1].bytes - c.hybrid[0].bytes == 126_976 * KV_TOKEN
    assert c.dense[1].bytes - c.dense[0].bytes == 126_976 * 4 * KV_TOKEN
    assert c.hybrid[0].weight_bytes == c.hybrid[1].weight_bytes      # weights and state: constant in the context


def test_deepseek_v32_bytes_by_kind_at_4096_and_131072_are_hand_counts(v32):
    c = _curve(v32)
    for h, d, ctx in zip(c.hybrid, c.dense, (4096, 131_072)):
        assert h.kv_bytes == 4 * 2048 * LATENT == 9_437_184           # capped at the top-2,048
        assert h.index_bytes == 4 * ctx * INDEX_KEY                    # the indexer reads every key
        assert d.kv_bytes == 4 * ctx * LATENT and d.index_bytes == 0   # dense MLA: every latent
        assert h.weight_bytes - d.weight_bytes == INDEXER == 111_673_344
    assert (c.hybrid[0].index_bytes, c.hybrid[1].index_bytes) == (2_162_688, 69_206_016)
    assert (c.dense[0].kv_bytes, c.dense[1].kv_bytes) == (18_874_368, 603_979_776)


# ---- where the model leaves its counterpart behind

def _memory_bound(m, ctx):
    return all(o.bound == "memory" for o in analyze_phase(W.decode(m, 1, ctx), H100).ops)


def _closed_form(c, x: float, slope_model: float, slope_dense: float) -> int:
    """The smallest context whose dense bytes reach x times the model's (both affine: b(ctx) = a + slope ctx)."""
    a_h = c.hybrid[0].bytes - slope_model * c.hybrid[0].context
    a_d = c.dense[0].bytes - slope_dense * c.dense[0].context
    return math.ceil((x * a_h - a_d) / (slope_dense - x * slope_model))


def test_the_crossing_contexts_follow_from_the_hand_counts(qwen, v32):
    for m in (qwen, dense_counterpart(qwen), v32, dense_counterpart(v32)):
        assert _memory_bound(m, 4096) and _memory_bound(m, 200_000)
    c = _curve(qwen, faster=1.5)
    # the same time ratio as the bytes' (time = bytes / 3.35 TB/s at every op)
    assert c.speedups[0] == pytest.approx(c.dense[0].bytes / c.hybrid[0].bytes, rel=1e-12)
    one, half = _closed_form(c, 1.0, KV_TOKEN, 4 * KV_TOKEN), _closed_form(c, 1.5, KV_TOKEN, 4 * KV_TOKEN)
    assert (one, half) == (8407, 125_214)
    assert c.crossings == ((1.0, one), (1.5, half))
    around = _curve(qwen, contexts=(half - 1, half), faster=1.5)
    assert around.speedups[0] < 1.5 <= around.speedups[1]
    assert _curve(qwen).faster_from(2.0) is None                       # 1.91x at 262,143: never 2x
    # DeepSeek-V3.2: from 2,048 on the model's bytes grow by the indexer's alone: each key (132 B) and its fp32 score,
    # written by index_scores and read back by index_topk, in each of the 4 layers
    d = _curve(v32)
    assert [(b.bytes - a.bytes) / 126_976 for a, b in (d.hybrid, d.dense)] == [4 * (INDEX_KEY + 2 * 4), 4 * LATENT]
    assert d.faster_from(1.0) == _closed_form(d, 1.0, 4 * (INDEX_KEY + 2 * 4), 4 * LATENT) == 30_017


def test_the_text_says_the_curve_and_the_crossings(qwen):
    text = context_curve_text(_curve(qwen, contexts=curve_contexts(qwen)))
    assert "Beside its dense counterpart: the same config with its 3 Gated DeltaNet layers as full attention: 4 " \
           "attention layers of 16 query and 2 KV heads x 256 (gated output), no recurrent state" in text
    assert ("from context 8,407 it is at least as fast as its dense counterpart's; it is never 2x faster up to "
            "context 262,143 (1.91x at 262,143)") in text
    row = next(ln for ln in text.splitlines() if ln.lstrip().startswith("131,072"))
    assert "268 MB" in row and "6.44 MB" in row and "1.07 GB" in row


# ---- the command

def _run(*args):
    return CliRunner().invoke(main, ["explain", *args])


def test_explain_vs_context_prints_and_its_json_carries_the_curve(qwen, tmp_path):
    p = tmp_path / "q"
    transformers.Qwen3NextConfig(num_hidden_layers=4, max_position_embeddings=LONG).save_pretrained(p)
    r = _run("--model", str(p), "--device", "h100", "--vs-context", "--faster", "1.5")
    assert r.exit_code == 0, r.output
    assert "from context 125,214 it is 1.5x faster" in r.output
    d = json.loads(_run("--model", str(p), "--device", "h100", "--vs-context", "--faster", "1.5", "--json").output)
    assert [x["context"] for x in d["rows"]] == list(curve_contexts(qwen))
    row = d["rows"][2]
    assert (row["context"], row["model"]["kv_bytes"], row["dense"]["kv_bytes"]) == (4096, 8_388_608, 33_554_432)
    assert row["model"]["state_bytes"] == STATE and row["speedup"] == row["dense"]["time_s"] / row["model"]["time_s"]
    assert d["crossings"] == [{"speedup": 1.0, "context": 8407}, {"speedup": 1.5, "context": 125_214}]
    assert d["counterpart"] == f"{p.name} (dense counterpart)" and d["kind"] == "linear"


@pytest.mark.parametrize("args, says", [
    (("--model", "llama-3-8b", "--vs-context"), "llama-3-8b attends densely in every layer"),
    (("--vs-context", "--context", "4096"), "--vs-context draws the decode step over contexts"),
    (("--faster", "3"), "--faster sets the speedup --vs-context searches for"),
    (("linear", "--vs-context"), "--spec, --acceptance, --draft, --mtp and --vs-context price a model's decode"),
])
def test_explain_vs_context_refuses_in_one_line(args, says):
    r = _run(*args)
    assert r.exit_code != 0 and says in r.output and "Traceback" not in r.output


def test_faster_below_one_is_refused(qwen):
    with pytest.raises(RooflineError, match="--faster is the speedup whose context is searched, at least 1"):
        _curve(qwen, faster=0.5)


# ---- the report's figure

def _header_only(path: Path, model) -> object:
    """A result file naming ``model`` on an H100 and holding no measurement (a hybrid cannot be swept yet: an
    endpoint's or a trace's file names it with --model)."""
    header = RunHeader(device=H100, model=model.to_dict(), dtype="bf16", kind="trace",
                       command=f"roofline trace trace.json --model {model.name}")
    with ResultWriter(path, header, mode="overwrite"):
        pass
    return read_results(path)


def _by_gid(fig):
    out = {}
    for ax in fig.axes:
        for a in ax.lines:
            if a.get_gid():
                out.setdefault(a.get_gid(), []).append(a)
    return out


def test_the_figure_draws_both_curves_from_the_formulas(qwen, tmp_path):
    from reports.figures import context_figure, figure_builders
    from reports.style import svg_bytes

    rf = _header_only(tmp_path / "q.jsonl", qwen)
    assert "context" in dict(figure_builders(rf))
    fig = context_figure(rf)
    assert fig.key == "context" and fig.title == "Decode against context, beside the dense counterpart"
    c = _curve(qwen, contexts=curve_contexts(qwen))
    g = _by_gid(fig.figure)
    (t,) = g["context:model:time"]
    assert list(t.get_xdata()) == list(curve_contexts(qwen))
    assert list(t.get_ydata()) == [p.time_s for p in c.hybrid]
    (dt,) = g["context:dense:time"]
    assert list(dt.get_ydata()) == [p.time_s for p in c.dense]
    assert list(g["context:model:kv"][0].get_ydata())[2] == 8_388_608
    assert list(g["context:dense:kv"][0].get_ydata())[2] == 33_554_432
    assert set(g["context:model:state"][0].get_ydata()) == {STATE}
    assert all(list(v.get_xdata()) == [8407, 8407] for v in g["context:faster:1"]) and len(g["context:faster:1"]) == 2
    assert "context:faster:2" not in g                                 # never 2x by 262,143
    svg = svg_bytes(fig.figure).decode()
    for gid in ("context:model:time", "context:dense:time", "context:model:bytes", "context:dense:bytes",
                "context:model:state", "context:faster:1"):
        assert f'id="{gid}"' in svg, gid
    for label in (f"{qwen.name}: every byte of the step", "dense counterpart: every byte of the step",
                  f"{qwen.name}: state read", "as fast from context 8,407", "1.91x", "262,143"):
        assert f"<!-- {label} -->" in svg, label             # text is drawn as paths, each after its words
    assert "at least as fast as its counterpart from context 8,407" in fig.caption
    assert "never 2x faster up to context 262,143" in fig.caption


def test_a_sparse_model_draws_its_indexer_keys_and_a_dense_one_no_figure(v32, tmp_path):
    from reports.figures import context_figure, figure_builders

    g = _by_gid(context_figure(_header_only(tmp_path / "v.jsonl", v32)).figure)
    assert list(g["context:model:index"][0].get_ydata())[2] == 4 * 4096 * INDEX_KEY
    assert [v.get_xdata()[0] for v in g["context:faster:1"]] == [30_017, 30_017]
    rf = read_results(Path(__file__).parent / "data" / "reports_h100.jsonl")
    assert "context" not in dict(figure_builders(rf))


CHROMIUM = Path("/usr/bin/chromium")


@pytest.mark.browser
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs headless chromium (/usr/bin/chromium)")
def test_the_html_report_renders_the_figure_in_chromium(qwen, tmp_path):
    import io

    import matplotlib.image

    from cdp import Browser
    from reports import write_report

    out = write_report([_header_only(tmp_path / "q.jsonl", qwen)], tmp_path / "rep")
    assert "svg:context" in out and "Decode against context" in (tmp_path / "rep" / "report.md").read_text()
    with Browser(str(CHROMIUM), width=1400, height=1000) as b:
        b.open(out["html"].resolve().as_uri())
        got = b.js("(function(){var i=document.querySelector('#fig-context img'); i.scrollIntoView(); "
                   "var r=i.getBoundingClientRect(); return [i.complete, i.naturalWidth, i.naturalHeight, r.width, "
                   "document.querySelector('#fig-context').textContent];})()")
        shot = matplotlib.image.imread(io.BytesIO(b.screenshot()), format="png")
        assert b.errors == []
    complete, nw, nh, width, text = got
    assert complete and nw > 900 and nh > 300 and width > 600           # the SVG decoded and laid out
    assert "dense counterpart" in text and "8,407" in text
    assert shot[..., :3].std() > 0.05


def test_a_mamba_hybrids_counterpart_has_its_mamba_layers_as_attention_and_no_state():
    """Nemotron-3-Nano (its published config, tests/data/hf_configs/hybrid/): 6 attention + 23 Mamba-2 + 23 MLP-only
    layers; the counterpart attends in all 29 mixer layers. KV per token and attention layer: 2 KV heads x 128 x 2
    (K, V) x 2 bytes = 1,024; the state (23 x 2,134,016 bytes) constant in the context."""
    m = load_model(Path(__file__).parent / "data" / "hf_configs" / "hybrid" / "nemotron-3-nano-30b-a3b.json")
    d = dense_counterpart(m)
    assert len(m.mamba_layers) == 23 and len(m.attention_layers) == 6
    assert d.mamba_layers == () and len(d.attention_layers) == 29 and d.no_mlp_layers == m.no_mlp_layers
    c = _curve(m)
    for h, dd, ctx in zip(c.hybrid, c.dense, (4096, 131_072)):
        assert h.kv_bytes == 6 * ctx * 1024 and dd.kv_bytes == 29 * ctx * 1024
        assert h.state_bytes == 23 * 2_134_016 == 49_082_368 and dd.state_bytes == 0
    assert c.hybrid[0].time_s > c.dense[0].time_s and c.hybrid[1].time_s < c.dense[1].time_s   # it crosses in between
