"""One self-contained HTML report: works offline, nothing fetched from the network.

Figures are inlined as base64 SVG ``<img>`` (isolated: no id clashes, no script); styles
and the small sort/filter script are inline. Charts with points carry an overlay of invisible,
focusable links at each point (``reports.hover``), each to the table row holding its numbers:
hover or focus shows them as a tooltip, a click marks the row (and a row its points). With
JavaScript off the chart, the table and the links remain. Every piece of text that comes from a result
file, a config, a file name or a command line goes through ``html.escape``.

``render(report) -> str`` takes the ``reports.ReportData`` built by ``write_report``.
"""

from __future__ import annotations

import base64
import json
import re
from html import escape

from roofline import formulas
from roofline import units as U

from . import trace_section
from .palette import tag_css
from .tables import POINT_COLUMNS, POINT_TIP, STEP_COLUMNS, STEP_TIP, ceiling_rows, phase_rows, point_rows

CSS = """
body{font:14px/1.45 -apple-system,"Segoe UI",Helvetica,Arial,sans-serif;color:#1d1d1f;margin:0;background:#fafafa}
main{max-width:1320px;margin:0 auto;padding:20px 28px 60px}
h1{font-size:22px;margin:8px 0 2px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
h3{font-size:15px;margin:18px 0 6px}.sub{color:#666;margin:0 0 12px}
.card{background:#fff;border:1px solid #e2e2e2;border-radius:6px;padding:12px 16px;margin:10px 0}
.verdicts li{margin:4px 0}.tag{display:inline-block;padding:0 6px;border-radius:3px;font-size:12px;color:#fff;margin-right:6px}
table{border-collapse:collapse;font-size:12.5px;background:#fff}th,td{border:1px solid #e4e4e4;padding:3px 7px;text-align:right;white-space:nowrap}
th{background:#f1f1f1;position:sticky;top:0;cursor:pointer;user-select:none}td.t,th.t{text-align:left}
tr.warn td{background:#fff4f4}tr.skip td{color:#999}
figure{margin:14px 0;background:#fff;border:1px solid #e2e2e2;border-radius:6px;padding:10px}
figure img{max-width:100%;height:auto;display:block;margin:0 auto}figcaption{color:#444;font-size:13px;margin-top:6px}
.note{background:#fff8e1;border:1px solid #f0d98a;border-radius:6px;padding:8px 12px;margin:10px 0}
.scroll{max-height:560px;overflow:auto;border:1px solid #e2e2e2}pre{white-space:pre-wrap;font-size:12px}
.controls{margin:6px 0}.controls input,.controls select{font:inherit;padding:2px 6px;margin-right:8px}
.runs{display:grid;grid-template-columns:repeat(auto-fit,minmax(600px,1fr));gap:0 22px}
dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px;margin:0}dt{color:#666}dd{margin:0;word-break:break-all}
.chart{position:relative;width:fit-content;max-width:100%;margin:0 auto}.chart img{margin:0}
svg.hover{position:absolute;left:0;top:0;width:100%;height:100%}
svg.hover circle{fill:transparent;stroke:none;pointer-events:all;cursor:pointer}svg.hover a:focus{outline:none}
svg.hover a:hover circle,svg.hover a:focus circle{stroke:#111;stroke-width:1.3}
svg.hover a.hl circle{stroke:#d62728;stroke-width:2.6;fill:rgba(214,39,40,.14)}
tr.hl td{background:#fff1b8}tr[id]{cursor:pointer}
#tip{position:absolute;z-index:10;background:#fff;border:1px solid #b9b9b9;border-radius:5px;padding:6px 9px;font-size:12.5px;
line-height:1.4;box-shadow:0 2px 10px rgba(0,0,0,.18);pointer-events:none;max-width:440px}#tip div:first-child{font-weight:600}
"""

JS = """
(function(){
  var t=document.getElementById('points'); if(!t) return;
  var body=t.tBodies[0], rows=Array.prototype.slice.call(body.rows);
  var q=document.getElementById('q'), ph=document.getElementById('phase'), lb=document.getElementById('label');
  var shown=document.getElementById('shown');
  function filter(){
    var s=q.value.toLowerCase(), p=ph.value, l=lb.value, n=0;
    rows.forEach(function(r){
      var ok=(!s||r.textContent.toLowerCase().indexOf(s)>=0)&&(!p||r.dataset.phase===p)&&(!l||r.dataset.label===l);
      r.style.display=ok?'':'none'; if(ok) n++;
    });
    shown.textContent=n+' of '+rows.length+' points';
  }
  [q,ph,lb].forEach(function(e){e.addEventListener('input',filter);});
  Array.prototype.forEach.call(t.tHead.rows[0].cells,function(th,i){
    th.addEventListener('click',function(){
      var asc=th.dataset.dir!=='asc'; th.dataset.dir=asc?'asc':'desc';
      rows.sort(function(a,b){
        var ca=a.cells[i], cb=b.cells[i];
        var x=ca.dataset.v!==undefined?ca.dataset.v:ca.textContent, y=cb.dataset.v!==undefined?cb.dataset.v:cb.textContent;
        var nx=parseFloat(x), ny=parseFloat(y);
        var c=(!isNaN(nx)&&!isNaN(ny))?nx-ny:String(x).localeCompare(String(y));
        return asc?c:-c;
      });
      rows.forEach(function(r){body.appendChild(r);});
    });
  });
  filter();
})();
"""

# Points that explain themselves (reports.hover): each mark links to the table row that holds its numbers. Hover or
# focus shows the row's cells through its table's data-tip template; a click (or Enter) marks the row and scrolls to
# it; a click on a row marks its points. Without JavaScript the links still lead to the rows.
HOVER_JS = """
(function(){
  var tip=document.getElementById('tip'); if(!tip) return;
  function near(e,sel){return e.target&&e.target.closest?e.target.closest(sel):null;}
  function lines(tr){
    var t=tr.closest('table'), tpl=t.getAttribute('data-tip')||'', hs=t.tHead.rows[0].cells, d={};
    for(var i=0;i<hs.length;i++) d[hs[i].textContent]=tr.cells[i]?tr.cells[i].textContent.trim():'';
    var out=[];
    tpl.split('\\n').forEach(function(line){
      var any=false, s=line.replace(/\\{([^}]+)\\}/g,function(m,k){var v=d[k]||''; if(v&&v!=='-'&&v!=='n/a') any=true; return v;});
      if(any) out.push(s);
    });
    return out;
  }
  function under(a,e){
    var svg=a.closest('svg'), out=[]; if(!e||!svg.getScreenCTM) return out;
    var pt=svg.createSVGPoint(); pt.x=e.clientX; pt.y=e.clientY; pt=pt.matrixTransform(svg.getScreenCTM().inverse());
    Array.prototype.forEach.call(svg.querySelectorAll('a'),function(b){
      var c=b.firstChild, dx=pt.x-c.cx.baseVal.value, dy=pt.y-c.cy.baseVal.value, r=c.r.baseVal.value;
      if(b!==a&&dx*dx+dy*dy<=r*r) out.push(b.getAttribute('aria-label'));
    });
    return out;
  }
  function show(a,e){
    var tr=document.getElementById(a.getAttribute('data-k')); if(!tr) return;
    var ls=lines(tr), more=under(a,e);
    if(more.length) ls.push('also here: '+more.slice(0,3).join('; ')+(more.length>3?' (+'+(more.length-3)+' more)':''));
    tip.textContent='';
    ls.forEach(function(l){var d=document.createElement('div'); d.textContent=l; tip.appendChild(d);});
    tip.hidden=false;
    var b=a.getBoundingClientRect(), sx=window.scrollX, sy=window.scrollY, x=b.right+sx+10, w=tip.offsetWidth;
    if(x+w>document.documentElement.clientWidth+sx-8) x=Math.max(sx+4,b.left+sx-w-10);
    tip.style.left=x+'px'; tip.style.top=(b.top+sy-4)+'px';
  }
  function hide(){tip.hidden=true;}
  function pick(id,scroll){
    Array.prototype.forEach.call(document.querySelectorAll('.hl'),function(e){e.classList.remove('hl');});
    Array.prototype.forEach.call(document.querySelectorAll('svg.hover a[data-k="'+id+'"]'),
      function(e){e.classList.add('hl');});
    var tr=document.getElementById(id); if(!tr) return;
    tr.classList.add('hl');
    var det=tr.closest('details'); if(det) det.open=true;
    if(tr.style.display==='none'){
      ['q','phase','label'].forEach(function(k){var e=document.getElementById(k); if(e) e.value='';});
      var q=document.getElementById('q'); if(q) q.dispatchEvent(new Event('input'));
    }
    if(scroll) tr.scrollIntoView({block:'center'});
  }
  document.addEventListener('mouseover',function(e){var a=near(e,'svg.hover a'); if(a) show(a,e);});
  document.addEventListener('mouseout',function(e){if(near(e,'svg.hover a')) hide();});
  document.addEventListener('focusin',function(e){var a=near(e,'svg.hover a'); if(a) show(a);});
  document.addEventListener('focusout',function(e){if(near(e,'svg.hover a')) hide();});
  document.addEventListener('keydown',function(e){if(e.key==='Escape') hide();});
  document.addEventListener('click',function(e){
    var a=near(e,'svg.hover a'); if(a){e.preventDefault(); pick(a.getAttribute('data-k'),true); return;}
    var tr=near(e,'tbody tr[id]'); if(tr) pick(tr.id,false);
  });
})();
"""
HOVER_HINT = ("Hover a point (or Tab to it) for its numbers; click it (or press Enter) to find its row in the table; "
              "click a row to mark its point.")


def _e(x) -> str:
    return escape(str(x), quote=True)


def _sort_key(text: str, v) -> str:
    """The cell's data-v attribute: only where sorting needs more than the text (numbers, compactly)."""
    if isinstance(v, float):
        return f' data-v="{v:.6g}"'
    if isinstance(v, int) and not isinstance(v, bool):
        return f' data-v="{v}"'
    return "" if str(v) == text else f' data-v="{_e(v)}"'


def html_table(columns, rows, *, table_id="", text_cols=(), row_attrs=None, tip="") -> str:
    head = "".join(f'<th class="{"t" if c in text_cols else ""}">{_e(c)}</th>' for c in columns)
    tid = f' id="{table_id}"' if table_id else ""
    tid += f' data-tip="{_e(tip)}"' if tip else ""
    out = [f"<table{tid}><thead><tr>{head}</tr></thead><tbody>"]
    cls = [' class="t"' if c in text_cols else "" for c in columns]
    for i, row in enumerate(rows):
        attrs = row_attrs(i) if row_attrs else ""
        cells = "".join(f"<td{k}{_sort_key(text, v)}>{_e(text)}</td>" for k, (text, v) in zip(cls, row))
        out.append(f"<tr{attrs}>{cells}</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def figure_html(fig, paths, name_of=None) -> str:
    """The figure as an <img> (its SVG inlined as base64), with its hover overlay when ``name_of(mark)``
    gives each mark's (row id, spoken name)."""
    svg = paths["svg"].read_bytes()
    data = base64.b64encode(svg).decode("ascii")
    over = overlay(fig, svg, name_of) if name_of is not None and getattr(fig, "marks", ()) else ""
    return (f'<figure id="fig-{_e(fig.key)}"><div class="chart"><img alt="{_e(fig.title)}" '
            f'src="data:image/svg+xml;base64,{data}">{over}</div>'
            f"<figcaption><b>{_e(fig.title)}.</b> {_e(fig.caption)}</figcaption></figure>")


def overlay(fig, svg: bytes, name_of) -> str:
    """Invisible, focusable links over the chart's points (reports.hover.Mark, in the SVG's own units), each to the
    table row that holds its numbers; the same viewBox as the image, so they scale with it."""
    m = re.search(rb'viewBox="([0-9. ]+)"', svg[:4000])
    if m is None:
        return ""
    out = []
    for k in fig.marks:
        rid, name = name_of(k)
        out.append(f'<a href="#{rid}" data-k="{rid}" aria-label="{_e(name)}"><circle cx="{k.x:g}" cy="{k.y:g}" '
                   f'r="{k.r:g}"/></a>')
    return (f'<svg class="hover" viewBox="{m.group(1).decode()}" role="group" '
            f'aria-label="{_e(fig.title)}: its points">{"".join(out)}</svg>')


def _names(run):
    """Row id and spoken name of a run's marks: an op ('p') or a step ('s')."""
    res, steps = run.analysis.results, run.analysis.steps

    def name_of(k):
        if k.kind == "s":
            return f"s{run.index}-{k.index}", f"{steps[k.index].title} (step)"
        p = res[k.index].point
        return f"r{run.index}-{k.index}", f"{p.phase} {p.op}, batch {p.batch}, context {p.context}, {p.backend}"
    return name_of


def latency_only(rf) -> bool:
    """A latency run with no kernel measurements: it has timelines, not a roofline."""
    return not rf.measurements and bool(rf.requests or rf.summaries)


def _tag(label: str) -> str:
    return f'<span class="tag {_e(label)}">{_e(label)}</span>'


def _run_top(run) -> str:
    rf, h = run.rf, run.rf.header
    dev = h.device
    out = [f'<h2 id="run-{run.index}">{_e(run.name)}</h2>',
           f'<p class="sub">{_e(h.model_name)} &middot; {_e(dev.name)} ({_e(dev.kind)}) &middot; {_e(h.dtype)} '
           f"&middot; {len(rf.measurements)} measurements from <code>{_e(rf.path)}</code></p>"]
    if latency_only(rf):
        n_req = len(rf.requests)
        n_cfg = len({t.config for t in rf.requests})
        out.append(f'<div class="card"><h3>Latency run</h3><p>{n_req} request timelines over {n_cfg} '
                   "configuration(s); their figures and formulas follow. No kernel was profiled in this file, so "
                   "it has no roofline of its own.</p></div>")
        out += [f'<div class="note">{_e(n)}</div>' for n in run.notes]
        return "".join(out)
    crow = ceiling_rows(h, used_dtypes(rf))
    ceil = html_table(("ceiling", "used to classify", "datasheet", "used / datasheet"),
                  [[(a, a), (b, b), (c, c), (d, d)] for a, b, c, d in crow], text_cols=("ceiling", "used to classify"))
    prov = f"<p class='sub'>Ceilings: {_e(dev.provenance or dev.source)}</p>"
    out.append(f'<div class="card"><h3>Device and ceilings</h3>{ceil}{prov}</div>')
    if trace_section.is_trace(rf):
        facts = "".join(f"<li>{_e(f)}</li>" for f in trace_section.trace_facts(run.analysis))
        top = html_table(trace_section.TOP_COLUMNS, trace_section.top_rows(run.analysis),
                     text_cols=("phase", "op", "kind", "label"))
        out.append(f'<div class="card"><h3>Where the traced time went</h3><ul>{facts}</ul>'
                   f'<h3>Top ops by time per step</h3><div class="scroll">{top}</div></div>')
    if run.steps:
        items = "".join(f"<li>{_tag(s.verdict)}{_e(s.sentence)}</li>" for s in run.analysis.headline())
        out.append(f'<div class="card"><h3>Verdicts</h3><ul class="verdicts">{items}</ul>')
        table = html_table(STEP_COLUMNS, phase_rows(run.steps, STEP_COLUMNS), tip=STEP_TIP,
                       text_cols=("phase", "backend", "dtype", "label", "by sum", "by mix"),
                       row_attrs=lambda j: f' id="s{run.index}-{j}"')
        out.append(f"<details><summary>Every step of the sweep ({len(run.steps)})</summary>"
                   f'<div class="scroll">{table}</div></details></div>')
    else:
        out.append('<div class="note">No ok measurements in this file: nothing to classify.</div>')
    for n in run.notes:
        out.append(f'<div class="note">{_e(n)}</div>')
    return "".join(out)


def page(title: str, body) -> str:
    """The self-contained document around ``body`` (a list of HTML strings): styles, tooltip, scripts."""
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>{_e(title)}</title><style>{CSS}{tag_css()}</style></head><body><main>"
            + "".join(body) + f'</main><div id="tip" role="tooltip" hidden></div><script>{JS}{HOVER_JS}</script>'
            "</body></html>")


def filter_controls(placeholder: str, phases, labels, label_word: str) -> str:
    """The text filter and the phase / label selects above a table with id "points" (the JS filters it)."""
    opts = lambda xs: "".join(f'<option value="{_e(x)}">{_e(x)}</option>' for x in xs)  # noqa: E731
    return (f'<div class="controls"><input id="q" placeholder="{_e(placeholder)}" size="32">'
            f'<select id="phase"><option value="">all phases</option>{opts(phases)}</select>'
            f'<select id="label"><option value="">all {_e(label_word)}</option>{opts(labels)}</select>'
            f'<span id="shown" class="sub"></span> <span class="sub">(click a header to sort)</span></div>')


def _points_table(runs) -> str:
    results = [(run, r) for run in runs for r in run.analysis.results]
    phases = sorted({r.point.phase for _, r in results})
    labels = sorted({r.label for _, r in results})
    controls = filter_controls("filter: op, flag, device...", phases, labels, "labels")

    ids = [f"r{run.index}-{i}" for run in runs for i in range(len(run.analysis.results))]

    def attrs(i: int) -> str:
        r = results[i][1]
        cls = " class='skip'" if not r.ok else (" class='warn'" if r.above_roof else "")
        return f' data-phase="{_e(r.point.phase)}" data-label="{_e(r.label)}" id="{ids[i]}"{cls}'
    rows = (row for run in runs for row in point_rows(run.analysis, run.name))
    table = html_table(POINT_COLUMNS, rows, table_id="points", text_cols=("run", "phase", "op", "backend", "dtype",
                                                                       "label", "flags"), row_attrs=attrs,
                   tip=POINT_TIP)
    return controls + f'<div class="scroll">{table}</div>'


def _metadata(run) -> str:
    h = run.rf.header
    timers = sorted({m.timer for m in run.rf.measurements})
    l2 = sorted({m.l2_policy for m in run.rf.measurements})
    items = [("command", h.command), ("started", h.started), ("git sha", h.git_sha), ("kind", h.kind),
             ("timers", ", ".join(timers)), ("L2 policy", ", ".join(l2)),
             ("versions", ", ".join(f"{k} {v}" for k, v in h.versions.items())),
             ("host / clocks", ", ".join(f"{k}={v}" for k, v in h.host.items())),
             ("settings", json.dumps(h.settings)), ("measured ceilings", json.dumps(h.ceilings)),
             ("model", json.dumps(h.model.to_dict() if h.model else None))]
    if h.flop_check:
        items.append(("FLOP check", json.dumps(h.flop_check)))
    dl = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v) if v else '-'}</dd>" for k, v in items)
    return f'<div class="card"><h3>{_e(run.name)}</h3><dl>{dl}</dl></div>'


def used_dtypes(rf) -> list[str]:
    """The run's dtype and every compute dtype its points use (the ceilings worth showing)."""
    return sorted({rf.header.dtype} | {m.point.compute_dtype for m in rf.measurements})


def conventions_text() -> str:
    """The cost conventions, from the roofline.formulas package docstring (one place)."""
    doc = formulas.__doc__ or ""
    i = doc.find("Conventions")
    return doc[i:].strip() if i >= 0 else doc.strip()


def render(report) -> str:
    runs = report.runs
    title = "Roofline report: " + "; ".join(f"{r.rf.header.model_name} on {r.rf.header.device.name}" for r in runs)
    body = [f"<h1>{_e(title)}</h1>",
            f'<p class="sub">{len(runs)} result file(s): {_e(", ".join(str(r.rf.path) for r in runs))}</p>']
    for n in report.notes:
        body.append(f'<div class="note">{_e(n)}</div>')
    tops = "".join(f"<section>{_run_top(run)}</section>" for run in runs)
    body.append(f'<div class="runs">{tops}</div>' if len(runs) > 1 else tops)
    if report.compare:
        body.append("<h2>Runs side by side</h2>")
        body += [figure_html(f, p) for f, p in report.compare]
    for run in runs:
        if run.figures:
            body.append(f"<h2>Figures: {_e(run.name)}</h2>")
            if any(getattr(f, "marks", ()) for f, _ in run.figures):
                body.append(f'<p class="sub">{_e(HOVER_HINT)}</p>')
            body += [figure_html(f, p, _names(run)) for f, p in run.figures]
    n = sum(len(r.rf.measurements) for r in runs)
    body.append(f"<h2>All points ({n})</h2>")
    body.append('<p class="sub">Times are per op instance (one layer); count = instances per step. '
                "0-FLOP ops are judged by bytes/s against bandwidth. Roof % = achieved / attainable at the "
                "op's intensity; labels: memory/compute by the ridge, overhead under 25% of the roof.</p>")
    body.append(_points_table(runs))
    body.append("<h2>Run metadata</h2>")
    body += [_metadata(r) for r in runs]
    body.append("<h2>Cost conventions</h2>")
    body.append(f'<div class="card"><pre>{_e(conventions_text())}</pre>'
                f'<p class="sub">From roofline/formulas/. Units: {_e(U.si(1e12, "FLOP/s"))} = 10^12 FLOP/s; '
                "bandwidth in bytes/s (SI).</p></div>")
    if any(trace_section.is_trace(r.rf) for r in runs):
        body.append(f'<div class="card"><h3>How a trace\'s ops are costed</h3><pre>'
                    f'{_e(trace_section.conventions())}</pre><p class="sub">From a rule file (roofline/traces/rules/, or your own through load_rules).</p></div>')
    return page(title, body)
