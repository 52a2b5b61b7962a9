"""Issue 30, honest views: the roofline draws every costed op whatever its phase, the report shows the costed
share of GPU time, and ``--json`` carries per-op FLOPs, bytes, category and the rule that costed it.

Fixture: a captured forward whose phase the trace does not tell (one "## forward ##" range, every GEMM at 2,048
rows: the README's ``trace --capture`` case): 4 x aten::mm [2048,4096]x[4096,4096] (150 us each) and 4 x aten::add
[2048,4096] (30 us each) on an H100. Before, its report drew only roofs and a callout into empty space.
"""

import json
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner

from profiler.cli import main
from roofline import formulas as F

DATA = Path(__file__).parent / "data" / "traces"
sys.path.insert(0, str(DATA))
from make_traces import BF, GEMM, Builder  # noqa: E402
from make_traces_issue24 import H100  # noqa: E402

US = 1e-6
CHROMIUM = Path("/usr/bin/chromium")
ADD = "void at::native::vectorized_elementwise_kernel<4, add>"


def forward_trace(path):
    b = Builder(devices=(H100,))
    b.annotation("## forward ##", 0, 2000)
    t, g = 10, 100
    for _ in range(4):
        e = b.op("aten::mm", t, 20, [[2048, 4096], [4096, 4096]], [BF, BF])
        b.launch(e, t + 2, g, 150, GEMM)
        e = b.op("aten::add", t + 30, 20, [[2048, 4096], [2048, 4096], []], [BF, BF, "Scalar"], ["", "", "1"])
        b.launch(e, t + 32, g + 160, 30, ADD)
        t, g = t + 60, g + 200
    b.dump(path)
    return path


def _run(*args):
    return CliRunner().invoke(main, ["trace", *map(str, args)], catch_exceptions=False)


def _drawn(svg: Path, gid: str) -> int:
    """How many markers the SVG group ``gid`` holds (the trace report's own SVG writes one <path> per marker, with
    its <title>; matplotlib's, for `roofline report`, a <path> each or <use> of one shared marker)."""
    root = ET.parse(svg).getroot()
    g = next((e for e in root.iter() if e.get("id") == gid), None)
    if g is None:
        return 0
    tag = lambda e: e.tag.rpartition("}")[2]      # noqa: E731
    shared = sum(1 for d in g.iter() if tag(d) == "defs" for e in d.iter() if tag(e) == "path")   # the marker
    return sum(1 for e in g.iter() if tag(e) in ("path", "use")) - shared


@pytest.fixture(scope="module")
def forward_report(tmp_path_factory):
    d = tmp_path_factory.mktemp("fwd")
    res = _run(forward_trace(d / "fwd.json"), "--out", d / "o", "--json")
    assert res.exit_code == 0, res.output
    return d / "o", json.loads(res.output)


def test_a_forward_only_trace_draws_its_points(forward_report):
    out, _ = forward_report
    figs = out / "figures"
    assert _drawn(figs / "roofline.svg", "points:forward") == 2           # the mm and the add
    assert _drawn(figs / "roofline.svg", "steps:forward") == 1            # the step the callout points at
    assert _drawn(figs / "predicted.svg", "pred:forward") == 2
    titles = [t.text for t in ET.parse(figs / "roofline.svg").getroot().iter("{http://www.w3.org/2000/svg}title")]
    assert sorted(t.split(" · ")[0] for t in titles) == ["aten::add [2048,4096]x[2048,4096] bf16",
                                                        "aten::mm [2048,4096]x[4096,4096] bf16", "forward step"]
    assert not (figs / "roofline.png").exists()           # PNGs only with --png


def test_the_report_shows_the_costed_share_of_gpu_time(forward_report):
    out, _ = forward_report
    for f in ("report.md", "report.html"):
        assert "Costed (FLOPs and bytes known): 100% of the GPU time (720 us of 720 us)" in (out / f).read_text()


def test_json_carries_each_op_s_flops_bytes_category_and_rule(forward_report):
    _, d = forward_report
    ops = {o["op"]: o for o in d["ops"]}
    mm, add = ops["aten::mm [2048,4096]x[4096,4096] bf16"], ops["aten::add [2048,4096]x[2048,4096] bf16"]
    c = F.gemm(2048, 4096, 4096)
    assert (mm["flops"], mm["bytes"]) == (c.flops, c.bytes) and mm["category"] == "gemm"
    assert mm["rule"].startswith("roofline.traces.rules.") and mm["phase"] == "forward"
    assert mm["instances"] == 4 and mm["time_s"] == pytest.approx(600 * US) and mm["kind"] == "costed"
    r = F.residual_add(2048, 4096)
    assert (add["flops"], add["bytes"]) == (r.flops, r.bytes) and add["category"] == "elementwise"
    assert d["ranks"][0]["costed_share"] == 1.0


@pytest.mark.browser
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs headless chromium (/usr/bin/chromium)")
def test_the_forward_report_draws_its_points_in_chromium(forward_report):
    from cdp import Browser

    out, _ = forward_report
    with Browser(str(CHROMIUM), width=1400, height=1000) as b:
        b.open((out / "report.html").resolve().as_uri())
        # the roofline figure's embedded SVG, parsed by the browser: its forward points and step are there
        n = b.js("""(function(){var img=document.querySelector('#fig-roofline img');
            var svg=new DOMParser().parseFromString(atob(img.src.split(',')[1]), 'image/svg+xml');
            var n=function(id){var g=svg.getElementById(id); return g ? g.querySelectorAll('path, use').length -
                g.querySelectorAll('defs path').length : 0;};
            return [img.naturalWidth, n('points:forward'), n('steps:forward')];
        })()""")
        assert n[0] > 0 and n[1:] == [2, 1]
        assert b.errors == []
        assert re.search("Costed \\(FLOPs and bytes known\\): 100%", b.js("document.body.innerText"))
