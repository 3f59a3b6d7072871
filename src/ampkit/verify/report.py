"""The compare report: one self-contained HTML page (the plots come from :mod:`ampkit.verify.report_plots`).

The page loads nothing from the network: styles are inline, the plots are embedded as base64 PNG,
and a few lines of inline script record, once the page has loaded, how many images decoded
(``<body data-images-loaded="N" data-images-total="M">``) so that a headless browser can check it.
The PNGs are also written beside the page for slides and issues.
"""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path
from typing import Any

from ampkit.training.speed import describe
from ampkit.verify.figures import allowed_text, mean_text, metric_format
from ampkit.verify.next_step import after_failure
from ampkit.verify.result import CompareResult
from ampkit.verify.report_plots import _allowed_bound, _figure, plot_pngs  # noqa: F401 (public names kept here)

__all__ = ["write_report", "render_html", "plot_pngs"]

# ---------------------------------------------------------------------------------------- HTML
_CSS = """
*{box-sizing:border-box}body{margin:0;font:15px/1.5 -apple-system,'Segoe UI',Roboto,'DejaVu Sans',sans-serif;
color:#111827;background:#f3f4f6}main{max-width:1080px;margin:0 auto;padding:24px}
.verdict{border-radius:14px;padding:22px 28px;color:#fff;margin-bottom:18px}
.verdict.pass{background:#15803d}.verdict.fail{background:#b91c1c}.verdict.inconclusive{background:#b45309}
.verdict code{background:#fff;color:#111827}
.verdict h1{margin:0;font-size:44px;letter-spacing:.02em}.verdict p{margin:4px 0 0;font-size:16px;opacity:.95}
.verdict ul{margin:10px 0 0;padding-left:22px;font-size:15px}
.cards{display:grid;grid-template-columns:repeat(4,1fr);gap:12px;margin-bottom:18px}
.card{background:#fff;border-radius:10px;padding:12px 16px;box-shadow:0 1px 2px rgba(0,0,0,.06)}
.card .k{font-size:12px;color:#6b7280;text-transform:uppercase;letter-spacing:.04em}
.card .v{font-size:24px;font-weight:600}.card .s{font-size:12px;color:#6b7280}
section{background:#fff;border-radius:10px;padding:16px 20px;margin-bottom:18px;box-shadow:0 1px 2px rgba(0,0,0,.06)}
section h2{margin:0 0 10px;font-size:18px}img{max-width:100%;height:auto;display:block}
.row{display:flex;gap:12px;align-items:flex-start}.row>img:first-child{flex:1 1 auto;min-width:0}.row>img.narrow{flex:0 0 330px;width:330px}
table{border-collapse:collapse;width:100%;font-size:13px}th,td{text-align:left;padding:5px 8px;border-bottom:1px solid #e5e7eb}
th{color:#4b5563;font-weight:600}td.num{text-align:right;font-variant-numeric:tabular-nums}
.tag{display:inline-block;padding:1px 8px;border-radius:9px;font-size:12px;font-weight:600}
.tag.low{background:#dbeafe;color:#1e40af}.tag.fp32{background:#e5e7eb;color:#374151}
.tag.promoted{background:#fef3c7;color:#92400e}.tag.fp64{background:#fee2e2;color:#991b1b}.tag.mixed{background:#f3e8ff;color:#6b21a8}
.tag.cast{background:#ede9fe;color:#5b21b6}
.warn{border-left:4px solid #d97706;padding:6px 12px;background:#fffbeb;margin:6px 0}
.note{color:#4b5563;font-size:13px;margin:4px 0}code{font-size:13px;background:#f3f4f6;padding:1px 4px;border-radius:4px}
footer{color:#4b5563;font-size:12px;text-align:center;margin-top:8px}
"""

_SCRIPT = """
window.addEventListener('load', function () {
  var imgs = Array.prototype.slice.call(document.images);
  var ok = imgs.filter(function (i) { return i.complete && i.naturalWidth > 0; });
  document.body.setAttribute('data-images-total', String(imgs.length));
  document.body.setAttribute('data-images-loaded', String(ok.length));
  imgs.forEach(function (i) { i.setAttribute('data-loaded', (i.complete && i.naturalWidth > 0) ? '1' : '0'); });
  document.body.setAttribute('data-height', String(Math.ceil(document.querySelector('main').getBoundingClientRect().bottom + window.scrollY)));
  document.body.setAttribute('data-report-ready', '1');
});
"""


def _e(x: Any) -> str:
    return html.escape(str(x))


def _img(name: str, png: bytes, alt: str, cls: str = "") -> str:
    data = base64.b64encode(png).decode("ascii")
    klass = f' class="{cls}"' if cls else ""
    return f'<img{klass} id="img-{_e(name.split(".")[0])}" alt="{_e(alt)}" src="data:image/png;base64,{data}">'


def _cards(r: CompareResult) -> str:
    m = r.final_metric
    amp = r.precision.upper()
    sp = r.ratios.get("speedup")
    ms = r.ratios.get("memory_saving")
    skipped = r.skipped.get("amp", {})
    total_skipped = sum(skipped.values())
    total_steps = r.steps * len(r.seeds)
    fmt = metric_format(m)  # the terminal summary writes the metric by the same rule
    cards = [
        (f"final {m.get('name', 'metric')}", mean_text(m, "amp", fmt),
         "; ".join(filter(None, (f"{amp}; FP32 {mean_text(m, 'fp32', fmt)}", allowed_text(m, fmt))))),
        ("speed-up", f"{sp:.2f}x" if sp else "n/a", _speed_note(r, amp)),
        ("memory saving", f"{ms:.0%}" if ms is not None else "n/a",
         "peak allocated" if ms is not None else f"not tracked on {r.device.get('type', '').upper()}"),
        ("skipped steps", f"{total_skipped}", f"of {total_steps} {amp} steps"),
    ]
    return "".join(f'<div class="card"><div class="k">{_e(k)}</div><div class="v">{_e(v)}</div>'
                   f'<div class="s">{_e(s)}</div></div>' for k, v, s in cards)


def _speed_note(r: "CompareResult", amp: str) -> str:
    """Under the speed-up card: the spread across seeds, or that none was measured (never a cause)."""
    text = describe(r.ratios.get("speedup_spread"), r.ratios.get("speedup"))
    return f"{amp} vs FP32 samples/s: {text.split(' ', 1)[1].strip('()') if ' ' in text else text}"


def _test_set(r: "CompareResult") -> str:
    """What the final metric was measured on, from the task's description ("... 360 test images ..."), and what
    one percentage point is there."""
    found = re.search(r"(\d[\d,]*) test (images|examples|samples|sequences)", r.task_description or "")
    if not found:
        return ""
    n = int(found.group(1).replace(",", ""))
    rate = "percentage point" in str(r.final_metric.get("margin_text", ""))
    per_point = f"; 1 percentage point = {n / 100:g} {found.group(2)}" if rate and n else ""
    return f"measured on {n:,} test {found.group(2)}{per_point}"


def _next_step(r: "CompareResult") -> str:
    """The 'what to do next' line: the flag or the API call for the user's own training."""
    prec = r.precision
    if r.passed:
        return (f"<p class=\"next\" id=\"next\"><b>Next</b>: use {prec.upper()} in your own training: "
                f"<code>ampkit.MixedPrecision(\"{_e(prec)}\")</code> in your loop, or "
                f"<code>ampkit train --task yours.py:make_task --precision {_e(prec)}</code>.</p>")
    if r.explain and (r.explain.get("recommendation") or {}).get("flags"):
        return (f"<p class=\"next\" id=\"next\"><b>Next</b>: rerun with "
                f"<code>{_e(r.explain['recommendation']['flags'])}</code> (see Explain below).</p>")
    cmd, what = after_failure(r)
    return f"<p class=\"next\" id=\"next\"><b>Next</b>: <code>{_e(cmd)}</code> {_e(what)}.</p>"


def _audit_section(audit: dict[str, Any] | None) -> str:
    if not audit:
        return ""
    share = audit.get("matmul_share")
    share_txt = f"{share:.0%}" if share is not None else "n/a (no matmul-like ops)"
    rows = []
    for m in audit.get("by_module", []):
        ops = ", ".join(f"{k.split(':')[0]}" + ("" if k.split(":")[1] == m["verdict"] else f" ({k.split(':')[1]})")
                        for k in m["ops"])
        rows.append(f'<tr><td><code>{_e(m["module"])}</code></td><td>{_e(m["type"])}</td>'
                    f'<td><span class="tag {_e(m["verdict"])}">{_e(m["verdict"])}</span></td>'
                    f'<td>{_e(ops)}</td><td class="num">{m["flops"]:,}</td></tr>')
    op_rows = []
    for o in audit.get("by_op", []):
        op_rows.append(f'<tr><td><code>{_e(o["op"])}</code></td><td>{_e(o["phase"])}</td><td class="num">{o["calls"]}</td>'
                       f'<td><span class="tag {_e(o["verdict"])}">{_e(o["verdict"])}</span></td>'
                       f'<td class="num">{o["flops"]:,}</td></tr>')
    surprises = "".join(f'<div class="warn"><b>{_e(s["kind"])}</b>: {_e(s["message"])}<br>'
                        f'<span class="note">fix: {_e(s["fix"])}</span></div>' for s in audit.get("surprises", []))
    return (f'<section id="audit"><h2>Audit: which ops ran in which dtype</h2>'
            f'<p>One forward and backward of the first batch under {_e(str(audit.get("dtype")))} autocast. '
            f'Model output dtype: <code>{_e(audit.get("output_dtype"))}</code>. '
            f'Share of matmul FLOPs in low precision: <b>{_e(share_txt)}</b>.</p>'
            f'{surprises or "<p class=note>No surprises: no matmul kept in FP32, no FP64, no hand-cast weights.</p>"}'
            f'<table><tr><th>module</th><th>type</th><th>ran in</th><th>ops (forward)</th><th>FLOPs</th></tr>'
            f'{"".join(rows)}</table>'
            f'<details style="margin-top:10px"><summary>per op type (forward and backward)</summary>'
            f'<table><tr><th>op</th><th>phase</th><th>calls</th><th>ran in</th><th>FLOPs</th></tr>{"".join(op_rows)}'
            f'</table></details>'
            f'<p class="note"><span class="tag low">low</span> computed in FP16/BF16 · '
            f'<span class="tag promoted">promoted</span> computed in FP32 from low-precision inputs (autocast\'s FP32 '
            f'list, or type promotion) · <span class="tag fp32">fp32</span> kept in FP32 · '
            f'<span class="tag fp64">fp64</span> FP64</p></section>')


def _explain_section(r: CompareResult, pngs: dict[str, bytes]) -> str:
    e = r.explain
    if not e:
        return ""
    rec = e.get("recommendation")
    head = (f'<div class="warn"><b>Recommended: <code>{_e(rec["flags"])}</code></b> ({_e(rec["change"])}, PASS in '
            f'the reruns)<br><code>{_e(rec["compare_command"])}</code><br>Python: <code>{_e(rec["python"])}</code>'
            f'</div>' if rec else "")
    lines = "".join(f"<li>{_e(x)}</li>" for x in e.get("summary", []))
    rows = "".join(
        f'<tr><td>{_e(c["change"])}</td><td><span class="tag {"low" if c["verdict"] == "pass" else "fp64"}">'
        f'{_e(c["verdict"])}</span></td><td class="num">{_e(_ratio(c.get("speed_vs_amp")))}</td>'
        f'<td class="num">{_e(_ratio(c.get("memory_vs_amp")))}</td><td class="num">{c.get("wall_s", 0):.0f} s</td>'
        f'<td>{_e("; ".join(c.get("reasons", [])[:1]))}</td></tr>' for c in e.get("candidates", []))
    table = (f'<table><tr><th>candidate</th><th>verdict</th><th>speed vs {r.precision.upper()}</th>'
             f'<th>memory vs {r.precision.upper()}</th><th>time</th><th>why</th></tr>{rows}</table>' if rows else "")
    img = _img("modules.png", pngs["modules.png"], "per-module error") if "modules.png" in pngs else ""
    notes = "".join(f'<p class="note">{_e(n)}</p>' for n in e.get("notes", []))
    return (f'<section id="explain"><h2>Explain: where the error comes from, and what fixes it</h2>{head}'
            f'<ul>{lines}</ul>{img}{table}{notes}<p class="note">{e.get("wall_s", 0):.0f} s of a '
            f'{e.get("budget_s", 0):.0f} s budget.</p></section>')


def _regions_section(r: CompareResult) -> str:
    if not r.regions:
        return ""
    rows = "".join(f'<tr><td><code>{_e(x["spec"])}</code></td><td>{_e(", ".join(x["names"]))}</td>'
                   f'<td class="num">{x["step_s_added"] * 1e3:+.2f} ms</td><td class="num">{_e(_ratio(x.get("slowdown")))}'
                   f'</td><td class="num">{_e(_mib(x.get("memory_added_bytes")))}</td></tr>' for x in r.regions["per_region"])
    return (f'<section id="regions"><h2>FP32 regions and their cost</h2><table><tr><th>spec</th><th>modules</th>'
            f'<th>time per step</th><th>slowdown</th><th>memory</th></tr>{rows}</table>'
            f'<p class="note">{_e(r.regions.get("method", ""))}</p></section>')


def _mib(v: Any) -> str:
    return "n/a" if v is None else f"{v / 2**20:+,.1f} MiB"


def _ratio(v: Any) -> str:
    return "n/a" if v is None else f"{v:.2f}x"


def _bound(v: Any) -> str:
    return "n/a" if v is None else f"{v:+.3%}"


def _res(v: Any) -> str:
    return "n/a" if v is None else f"{v:.3%}"


def _effects_section(r: CompareResult) -> str:
    """The paired tests behind the verdict: each judged quantity's effect, interval, tolerance and decision."""
    eff = r.effects or {}
    rows = []
    for kind, items in (("verdict", eff.get("endpoints", [])), ("curve window", eff.get("windows", []))):
        for e in items:
            tag = {"pass": "low", "fail": "fp64", "inconclusive": "promoted"}.get(e["decision"], "fp32")
            need = f'{e["seeds_to_decide"]} seeds' if e.get("seeds_to_decide") else ""
            rows.append(f'<tr><td>{_e(e["name"])}</td><td>{_e(kind)}</td><td class="num">{_bound(e["mean"])}</td>'
                        f'<td class="num">{_bound(e.get("lower"))} … {_bound(e.get("upper"))}</td>'
                        f'<td class="num">{e["tolerance"]:.3%}</td><td class="num">{_res(e.get("detectable"))}</td>'
                        f'<td><span class="tag {tag}">{_e(e["decision"])}</span></td><td>{_e(need)}</td></tr>')
    if not rows:
        return ""
    alpha = eff.get("alpha", 0.05)
    return (f'<section id="effects"><h2>The verdict: {r.precision.upper()} minus FP32, paired by seed</h2>'
            f'<table><tr><th>quantity</th><th>role</th><th>harm (mean)</th><th>bounds (lower … upper)</th>'
            f'<th>tolerance</th><th>resolution</th><th>decision</th><th>would decide</th></tr>{"".join(rows)}</table>'
            f'<p class="note">Harm: how much worse {r.precision.upper()} is than FP32 on the same seed (same weights, '
            f'same batches), relative to the FP32 value; positive is worse. Upper bound at {1 - alpha:.0%} one-sided '
            f'(pass below the tolerance), lower bound Bonferroni-corrected over the judged quantities (fail above '
            f'it). Resolution: how far from the tolerance a true harm must be for these seeds to decide it 80 % of '
            f'the time. Curve windows locate where the curves part; they do not decide the verdict.</p></section>')


def render_html(r: CompareResult, pngs: dict[str, bytes]) -> str:
    """The whole page as a string (images embedded)."""
    amp = r.precision.upper()
    verdict = r.verdict.upper()
    sub = (f"{_e(r.task)} · {amp} vs FP32 · {len(r.seeds)} seed{'s' if len(r.seeds) != 1 else ''} × {r.steps} steps"
           f" · {_e(r.device.get('name'))} ({_e(r.device.get('str'))})")
    if r.source:
        sub += (f'</p><p id="source">runs came from your script, unmodified: <code>{_e(r.task_description)}</code>, '
                f'each run a fresh process, FP32 by switching every autocast and GradScaler off')
    if r.reasons:
        body = "<ul>" + "".join(f"<li>{_e(x)}</li>" for x in r.reasons) + "</ul>"
    else:
        body = (f"<p>{amp} is within the tolerance of FP32 on every judged quantity (paired over "
                f"{len(r.seeds)} seeds, one-sided {1 - r.margins.get('alpha', 0.05):.0%} bounds), no scale collapse, "
                f"skipped steps within {r.margins['max_skip_share']:.0%}.</p>")
    test_set = _test_set(r)
    body += (f'<p class="task" id="task">{_e(r.task_description)}'
             + (f" · final {_e(r.final_metric.get('name'))} {_e(test_set)}" if test_set else "") + "</p>"
             if r.task_description else "") + _next_step(r)
    warns = "".join(f'<div class="warn"><b>{_e(w.get("code"))}</b>: {_e(w.get("message"))}'
                    + (f' (seeds {_e(", ".join(map(str, w["seeds"])))})' if len(w.get("seeds") or []) > 1 else "")
                    + (f'<br><span class="note">fix: {_e(w.get("fix"))}</span>' if w.get("fix") else "")
                    + "</div>" for w in r.warnings)
    notes = "".join(f'<p class="note">{_e(n)}</p>' for n in r.notes)
    figs = []
    if "loss.png" in pngs:
        metric = _img("metric.png", pngs["metric.png"], "final metric per seed", "narrow") if "metric.png" in pngs else ""
        figs.append(f'<section id="curves"><h2>Loss curves and final {_e(r.final_metric.get("name"))}</h2>'
                    f'<div class="row">{_img("loss.png", pngs["loss.png"], "loss curves")}{metric}</div>'
                    f'<p class="note">Grey: the FP32 seeds\' min-max per logged step, for reading the curves; the '
                    f'verdict comes from the paired differences below, not from this band.</p></section>')
        figs.append(_effects_section(r))
    if "scale.png" in pngs:
        figs.append(f'<section id="scale"><h2>FP16 loss scale</h2>{_img("scale.png", pngs["scale.png"], "loss scale")}'
                    f'</section>')
    figs.append(f'<section id="perf"><h2>Throughput and memory</h2>'
                f'{_img("throughput.png", pngs["throughput.png"], "throughput and memory")}'
                f'<p class="note">Measured in this process on this device; never part of the verdict.</p></section>')
    versions = ", ".join(f"{k} {v}" for k, v in r.versions.items() if v)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>ampkit compare: {verdict} ({_e(r.task)}, {amp})</title><style>{_CSS}</style></head>
<body data-verdict="{_e(r.verdict)}"><main>
<div class="verdict {_e(r.verdict)}" id="verdict"><h1>{verdict}</h1><p>{sub}</p>{body}</div>
<div class="cards">{_cards(r)}</div>
{f'<section id="warnings"><h2>Warnings and notes</h2>{warns}{notes}</section>' if warns or notes else ''}
{_explain_section(r, pngs)}
{''.join(figs)}
{_regions_section(r)}
{_audit_section(r.audit)}
<footer>ampkit compare · {_e(r.precision_reason)}<br>{_e(versions)} · {r.wall_s:.0f} s</footer>
</main><script>{_SCRIPT}</script></body></html>
"""


def write_report(r: CompareResult, folder: Path) -> tuple[Path, list[Path]]:
    """Write the PNGs and ``report.html`` into ``folder``; return ``(html path, png paths)``."""
    pngs = plot_pngs(r)
    paths = []
    for name, data in pngs.items():
        path = folder / name
        path.write_bytes(data)
        paths.append(path)
    page = folder / "report.html"
    page.write_text(render_html(r, pngs), encoding="utf-8")
    return page, paths
