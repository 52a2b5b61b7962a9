"""The HTML reports in headless Chromium, driven with real input events over the DevTools protocol
(tests/cdp.py): hover a known point and read its tooltip's numbers, click it to find its row, click a
row to mark its point, Tab and Enter from the keyboard, no console errors, a non-blank screenshot, and
the page with JavaScript off (links to the rows still work)."""

import io
from pathlib import Path

import pytest

from roofline import units as U
from roofline.analysis import analyze
from roofline.records import read_results

from cdp import Browser

DATA = Path(__file__).parent / "data"
H100, SLOW = DATA / "reports_h100.jsonl", DATA / "reports_h100_slow_op.jsonl"
CHROMIUM = Path("/usr/bin/chromium")

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not CHROMIUM.exists(), reason="needs headless chromium (/usr/bin/chromium)")]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    from reports import write_report

    return write_report([H100], tmp_path_factory.mktemp("hover"))["html"]


@pytest.fixture(scope="module")
def analysis():
    return analyze(read_results(H100))


@pytest.fixture(scope="module")
def browser():
    with Browser(str(CHROMIUM), width=1400, height=1000) as b:
        yield b


@pytest.fixture
def page(browser, report):
    browser.errors.clear()
    browser.open(report.resolve().as_uri())
    yield browser
    assert browser.errors == []                                   # no console message or exception


def _index(a, op, phase, batch, context) -> int:
    return next(i for i, r in enumerate(a.results)
                if (r.op, r.point.phase, r.point.batch, r.point.context) == (op, phase, batch, context))


def _centre(b, selector: str) -> tuple:
    """Scroll the element into the middle of the viewport; its centre in viewport pixels."""
    return tuple(b.js(f"""(function(){{var e=document.querySelector('{selector}'); e.scrollIntoView({{block:'center'}});
        var r=e.getBoundingClientRect(); return [r.left+r.width/2, r.top+r.height/2];}})()"""))


def _tip(b) -> list:
    return b.js("document.getElementById('tip').hidden ? null : "
                "Array.prototype.map.call(document.getElementById('tip').children, function(d){return d.textContent;})")


def test_hovering_a_point_shows_its_numbers(page, analysis):
    i = _index(analysis, "attention", "decode", 8, 128)              # the point above its roof
    r = analysis.results[i]
    m, p = r.m, r.point
    sel = f'#fig-roofline svg.hover a[data-k="r1-{i}"]'
    x, y = _centre(page, sel)
    assert page.js(f"document.elementFromPoint({x},{y}).closest('a').getAttribute('data-k')") == f"r1-{i}"
    assert _tip(page) is None
    page.mouse_move(x, y)
    assert _tip(page) == [
        "attention · decode · torch",
        "batch 8 · context 128 · bf16",
        f"{U.flops(p.cost.flops)} · {U.nbytes(p.cost.bytes)} · {U.intensity(p.cost.intensity)} FLOP/byte",
        f"median {U.seconds(m.median_s)} (p20 {U.seconds(m.p20_s)}, p80 {U.seconds(m.p80_s)}) · count 32",
        f"{U.flops_rate(m.achieved_flops)} · {U.bandwidth(m.achieved_bytes_per_s)}",
        f"roof {U.percent(r.roof_fraction)} · {r.label}",
        "flags: above-roof",
        "NVIDIA H100 SXM5 80GB",
    ]
    assert U.percent(r.roof_fraction) == "162%"                      # the numbers, as the fixture made them
    box = page.js("(function(){var r=document.getElementById('tip').getBoundingClientRect(); return [r.width, r.height];})()")
    assert box[0] > 150 and box[1] > 100                            # shown, beside the point
    page.mouse_move(5, 5)
    assert _tip(page) is None


def test_hovering_a_step_marker_shows_the_step(page, analysis):
    j, s = next((j, s) for j, s in enumerate(analysis.steps) if (s.phase, s.batch, s.context) == ("decode", 128, 4096))
    x, y = _centre(page, f'#fig-roofline svg.hover a[data-k="s1-{j}"]')
    page.mouse_move(x, y)
    lo, hi = s.time_range
    tip = _tip(page)
    assert tip[:3] == ["decode step · torch (its ops summed)", "batch 128 · context 4,096 · bf16",
                       f"step time {U.seconds(s.time_s)} (p20-p80 {U.seconds(lo)} - {U.seconds(hi)}); at the roof "
                       f"{U.seconds(s.predicted_s)}"]
    assert f"roof {U.percent(s.roof_fraction)} · {s.label} (by sum memory, by mix memory)" in tip


def test_clicking_a_point_finds_its_row_and_a_row_marks_its_points(page, analysis):
    i = _index(analysis, "attention", "decode", 8, 128)
    x, y = _centre(page, f'#fig-roofline svg.hover a[data-k="r1-{i}"]')
    page.click(x, y)
    row = page.js(f"""(function(){{var r=document.getElementById('r1-{i}'), b=r.getBoundingClientRect();
        return [r.classList.contains('hl'), b.top >= 0 && b.bottom <= window.innerHeight];}})()""")
    assert row == [True, True]                                       # marked and scrolled into view
    assert page.js("location.hash") == ""                           # handled by the script, not navigated
    k = _index(analysis, "q_proj", "decode", 32, 1024)
    x, y = _centre(page, f"#r1-{k} td:nth-child(3)")
    page.click(x, y)
    marked = page.js("Array.prototype.map.call(document.querySelectorAll('svg.hover a.hl'), "
                     "function(a){return a.closest('figure').id + ' ' + a.getAttribute('data-k');})")
    every = page.js(f"Array.prototype.map.call(document.querySelectorAll('svg.hover a[data-k=\"r1-{k}\"]'), "
                    "function(a){return a.closest('figure').id + ' ' + a.getAttribute('data-k');})")
    assert sorted(marked) == sorted(every) and len(every) >= 3      # roofline, predicted, both sweep panels
    assert f"fig-roofline r1-{k}" in marked and page.js(f"document.getElementById('r1-{k}').className") == "hl"
    assert not page.js(f"document.getElementById('r1-{i}').classList.contains('hl')")


def test_keyboard_tab_focuses_points_and_enter_finds_the_row(page, analysis):
    for _ in range(60):
        page.key("Tab", "Tab", 9)
        key = page.js("(function(){var a=document.activeElement; return a && a.closest && a.closest('svg.hover') ? "
                      "a.getAttribute('data-k') : null;})()")
        if key:
            break
    assert key and key.startswith(("r1-", "s1-"))
    tip = _tip(page)
    if key.startswith("r1-"):
        r = analysis.results[int(key[3:])]
        assert tip[0] == f"{r.op} · {r.point.phase} · {r.point.backend}"
        assert f"median {U.seconds(r.m.median_s)}" in tip[3]
    else:
        assert tip[0].endswith("(its ops summed)")
    page.key("Enter", "Enter", 13)
    assert page.js(f"document.getElementById('{key}').classList.contains('hl')")


def test_the_page_is_not_blank(page):
    import matplotlib.image

    page.js("document.getElementById('fig-roofline').scrollIntoView()")
    img = matplotlib.image.imread(io.BytesIO(page.screenshot()), format="png")
    assert img.shape[:2] == (1000, 1400) and img[..., :3].std() > 0.05


def test_with_javascript_off_the_chart_table_and_links_remain(browser, report, analysis):
    browser.call("Emulation.setScriptExecutionDisabled", value=True)
    try:
        browser.errors.clear()
        browser.open(report.resolve().as_uri())
        assert browser.js("document.querySelectorAll('figure img').length") == 5
        assert browser.js("document.querySelectorAll('#points tbody tr').length") == 327
        assert browser.js("document.getElementById('shown').textContent") == ""   # the script did not run
        i = _index(analysis, "attention", "decode", 8, 128)
        x, y = _centre(browser, f'#fig-roofline svg.hover a[data-k="r1-{i}"]')
        browser.click(x, y)                                           # a plain link to the row
        assert browser.js("location.hash") == f"#r1-{i}"
        assert browser.js("document.getElementById('tip').hidden") is True
        assert browser.errors == []
    finally:
        browser.call("Emulation.setScriptExecutionDisabled", value=False)


def test_the_compare_report_explains_its_points(browser, tmp_path):
    from reports.compare_report import write_compare

    w = write_compare(H100, SLOW, tmp_path / "cmp")
    c = w.comparison
    k = next(k for k, o in enumerate(c.ops) if o.title == "decode o_proj b32 c1024")
    o = c.ops[k]
    browser.errors.clear()
    browser.open(w.paths["html"].resolve().as_uri())
    x, y = _centre(browser, f'#fig-change svg.hover a[data-k="c-{k}"]')
    browser.mouse_move(x, y)
    tip = _tip(browser)
    lo, hi = o.time.interval
    assert tip[0] == "o_proj · decode · torch"
    assert tip[2] == f"per step {U.seconds(o.time.before)} -> {U.seconds(o.time.after)} (saved {U.seconds(o.time.saved)})"
    assert tip[3] == f"speed-up 0.50x (range {lo:.2f}-{hi:.2f}x) · slower"
    assert browser.js("document.querySelectorAll('#points tbody tr').length") == len(c.ops)
    assert browser.errors == []
