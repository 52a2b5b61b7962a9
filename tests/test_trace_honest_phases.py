"""Issue 30, honest views: phase names match whole words ("decoder" is not decode; roofline.traces.phases)."""

import sys
from pathlib import Path

import pytest

from roofline.traces.analyze import analyze_trace
from roofline.traces.events import read_trace
from roofline.traces.phases import DEFAULT_MARKERS, FORWARD, marked_phase, parse_markers

DATA = Path(__file__).parent / "data" / "traces"
sys.path.insert(0, str(DATA))
from make_traces import BF, GEMM, Builder  # noqa: E402
from make_traces_issue24 import H100  # noqa: E402


@pytest.mark.parametrize("name, phase", [
    ("decode", "decode"), ("DECODE", "decode"), ("decode_step", "decode"), ("forward decode", "decode"),
    ("vllm::decode0", "decode"), ("prefill", "prefill"), ("chunked-prefill #3", "prefill"),
    ("## decoder ##", None), ("## decoder forward ##", None), ("TransformerDecoderLayer", None),
    ("predecode", None), ("decoded_tokens", None), ("prefilled", None), ("decode and prefill", None),
])
def test_a_phase_marker_is_a_whole_word(name, phase):
    assert marked_phase(name, DEFAULT_MARKERS) == phase


def test_user_markers_are_whole_words_too():
    from roofline.traces.phases import has_word

    m = parse_markers(["decode=gen_step"])
    assert marked_phase("my gen_step 3", m) == "decode" and marked_phase("gen_steps", m) is None
    assert has_word("DistributedDataParallel.forward", "forward") and not has_word("forwarder", "forward")


def _training_trace(path):
    """A recommender's training step under a user annotation '## decoder ... ##': 3 GEMMs of 4,096 rows, 100 us
    each, then its backward (the same rows)."""
    b = Builder(devices=(H100,))
    b.annotation("## decoder fwd+bwd ##", 0, 2000)
    for i in range(3):
        e = b.op("aten::mm", 10 + 100 * i, 20, [[4096, 512], [512, 512]], [BF, BF])
        b.launch(e, 12 + 100 * i, 400 + 100 * i, 100, GEMM)
    b.dump(path)
    return path


def test_a_decoder_annotation_does_not_make_a_training_trace_a_decode(tmp_path):
    r = analyze_trace(read_trace(_training_trace(tmp_path / "train.json")))
    assert {m.point.phase for m in r.measurements} == {FORWARD}
    assert "decode" not in r.summary["phases"]
    (m,) = r.measurements
    assert m.point.count == 3 and r.summary["phases"][FORWARD]["tokens"] == 4096
