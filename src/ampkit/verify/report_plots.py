"""The compare report's PNG plots (matplotlib, Agg canvas), one function per figure.

Matplotlib is used through ``Figure`` + ``FigureCanvasAgg`` directly, never ``pyplot``: the report must
not change the backend of a user's interactive session.
"""

from __future__ import annotations

import io
import math
from typing import Any

from ampkit.verify.result import CompareResult
from ampkit.training.speed import describe, fmt_rate

__all__ = ["plot_pngs"]

FP32_COLOR = "#6b7280"
AMP_COLOR = "#2563eb"
FAIL_COLOR = "#dc2626"
PASS_COLOR = "#16a34a"
SCALE_COLOR = "#d97706"


def _figure(width: float = 7.2, height: float = 3.6) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _style(ax: Any) -> None:
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.grid(True, alpha=0.25, linewidth=0.6)
    ax.tick_params(labelsize=8)


def _loss_plot(r: CompareResult) -> bytes:
    b = r.band
    amp = r.precision.upper()
    fig = _figure(7.6, 3.9)
    ax = fig.add_subplot()
    steps = b["steps"]
    ok = [i for i, v in enumerate(b["upper"]) if v is not None]
    xs = [steps[i] for i in ok]
    # Only an upward exit fails (a lower loss is not harm), so the allowed region drawn is lo..upper.
    ax.fill_between(xs, [b["lo"][i] for i in ok], [b["hi"][i] for i in ok], color=FP32_COLOR, alpha=0.35,
                    linewidth=0, label=f"FP32 seeds min-max ({len(r.seeds)} seeds)")
    for k, (seed, pts) in enumerate(r.curves["amp"].items()):
        px = [p[0] for p in pts if p[1] is not None]
        py = [p[1] for p in pts if p[1] is not None]
        ax.plot(px, py, color=AMP_COLOR, linewidth=1.3, alpha=0.85, label=f"{amp} (each seed)" if k == 0 else None)
        bad = [p[0] for p in pts if p[1] is None]
        if bad:
            ymax = max([v for v in b["upper"] if v is not None] or [1.0])
            ax.scatter(bad, [ymax] * len(bad), marker="x", color=FAIL_COLOR, s=18, zorder=5,
                       label="non-finite loss" if k == 0 else None)
    positive = all(v is None or v > 0 for v in b["lo"]) and all(
        p[1] is None or p[1] > 0 for c in r.curves["amp"].values() for p in c)
    if positive:
        ax.set_yscale("log")
    ax.set_xlabel("optimizer step", fontsize=9)
    ax.set_ylabel("training loss" + (" (log scale)" if positive else ""), fontsize=9)
    ax.set_title(f"Loss: {amp} (each seed) over the FP32 seeds' range", fontsize=10, loc="left")
    _style(ax)
    ax.legend(fontsize=8, frameon=False)
    return _png(fig)


def _metric_plot(r: CompareResult) -> bytes | None:
    m = r.final_metric
    if not m.get("fp32") or not m.get("amp"):
        return None
    fig = _figure(4.2, 3.3)
    ax = fig.add_subplot()
    labels = ["FP32", r.precision.upper()]
    for x, (side, color) in enumerate((("fp32", FP32_COLOR), ("amp", AMP_COLOR))):
        vals = [v for v in m[side] if v is not None and math.isfinite(v)]
        ax.scatter([x] * len(vals), vals, color=color, s=36, zorder=3, alpha=0.9)
        if vals:
            mean = sum(vals) / len(vals)
            ax.hlines(mean, x - 0.22, x + 0.22, color=color, linewidth=2)
    allowed = m.get("allowed")
    if allowed:
        _allowed_bound(ax, allowed, bool(m.get("higher_is_better")))
    ax.set_xticks([0, 1], labels)
    ax.set_xlim(-0.6, 1.6)
    ax.set_title(f"Final {m['name']} per seed", fontsize=10, loc="left")
    _style(ax)
    return _png(fig)


def _allowed_bound(ax: Any, allowed: list[float], higher_is_better: bool) -> None:
    """The one bound that can fail, as a dashed line, and the failing side shaded: the allowed range itself
    holds every seed and so would fill the whole axis (invisible)."""
    bound = allowed[0] if higher_is_better else allowed[1]
    lo, hi = ax.get_ylim()
    pad = 0.25 * max(hi - lo, abs(bound) * 1e-3, 1e-9)
    lo, hi = min(lo, bound - pad), max(hi, bound + pad)
    ax.set_ylim(lo, hi)
    if higher_is_better:
        ax.axhspan(lo, bound, color=FAIL_COLOR, alpha=0.10, linewidth=0, label=f"fails below {bound:.4g}")
    else:
        ax.axhspan(bound, hi, color=FAIL_COLOR, alpha=0.10, linewidth=0, label=f"fails above {bound:.4g}")
    ax.axhline(bound, color=FAIL_COLOR, linestyle="--", linewidth=1)
    ax.legend(fontsize=8, frameon=False, loc="best")


def _perf_plot(r: CompareResult) -> bytes:
    return _png(_perf_figure(r))


def _perf_figure(r: CompareResult) -> Any:
    fig = _figure(7.6, 2.6)
    ax1, ax2 = fig.subplots(1, 2)
    labels = ["FP32", r.precision.upper()]
    colors = [FP32_COLOR, AMP_COLOR]
    sps = [r.throughput.get("fp32") or 0.0, r.throughput.get("amp") or 0.0]
    bars = ax1.bar(labels, sps, color=colors, width=0.55)
    ax1.bar_label(bars, labels=[fmt_rate(v) for v in sps], fontsize=8, padding=2)
    sp = r.ratios.get("speedup")
    ax1.set_title(f"Throughput, {r.throughput.get('unit', 'samples/s')}", fontsize=10, loc="left")
    if sp:  # a figure-level line of its own: inside ax1's title it ran into "Peak memory" (issue 45)
        fig.suptitle(f"{r.precision.upper()} speed-up {describe(r.ratios.get('speedup_spread'), sp)}",
                     x=0.01, ha="left", fontsize=10)
    ax1.margins(y=0.18)
    _style(ax1)
    mem = [r.memory.get("fp32"), r.memory.get("amp")]
    if all(v is not None for v in mem):
        mib = [v / 2**20 for v in mem]
        bars = ax2.bar(labels, mib, color=colors, width=0.55)
        ax2.bar_label(bars, labels=[f"{v:,.0f}" for v in mib], fontsize=8, padding=2)
        saving = r.ratios.get("memory_saving")
        ax2.set_title("Peak memory, MiB" + (f" ({saving:.0%} saved)" if saving is not None else ""),
                      fontsize=10, loc="left")
        ax2.margins(y=0.18)
        _style(ax2)
    else:
        ax2.set_axis_off()
        ax2.set_title("Peak memory", fontsize=10, loc="left")
        ax2.text(0.5, 0.5, f"n/a on {r.device.get('type', 'this device').upper()}\n"
                           "(torch does not track these allocations)",
                 ha="center", va="center", fontsize=9, color=FP32_COLOR, transform=ax2.transAxes)
    return fig


def _scale_plot(r: CompareResult) -> bytes | None:
    if not r.scale_trace:
        return None
    fig = _figure(7.6, 2.9)
    ax = fig.add_subplot()
    for k, (seed, pts) in enumerate(r.scale_trace.items()):
        ax.plot([p[0] for p in pts], [p[1] for p in pts], color=SCALE_COLOR, linewidth=1.3, alpha=0.85,
                drawstyle="steps-post", label="loss scale (each seed)" if k == 0 else None)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("optimizer step", fontsize=9)
    ax.set_title("FP16 loss scale over time (falls on overflow, grows while stable)", fontsize=10, loc="left")
    _style(ax)
    ax.legend(fontsize=8, frameon=False)
    return _png(fig)


def _module_error_plot(r: CompareResult) -> bytes | None:
    """compare --explain: the error each module adds (forward and backward, relative to FP32), log scale."""
    rows = [m for m in (r.explain or {}).get("ranking", []) if not m["module"].startswith("(")][:12]
    if not rows:
        return None
    floor = 1e-6
    cap = 10.0  # inf/NaN (None) drawn at the right edge, in red
    fig = _figure(7.6, 0.9 + 0.32 * len(rows))
    ax = fig.add_subplot()
    ys = list(range(len(rows)))[::-1]
    for off, key, color in ((0.18, "fwd", AMP_COLOR), (-0.18, "bwd", SCALE_COLOR)):
        vals = [cap if m.get(key) is None and m.get("added") is None else max(m.get(key) or floor, floor) for m in rows]
        colors = [FAIL_COLOR if m.get("events") else color for m in rows]
        ax.barh([y + off for y in ys], vals, height=0.34, color=colors, alpha=0.9 if key == "fwd" else 0.6)
    ax.set_xscale("log")
    ax.set_yticks(ys, [f"{m['module']} ({m['type']})" for m in rows], fontsize=8)
    ax.set_xlabel("relative error this module adds (one batch, same weights as FP32)", fontsize=8)
    ax.set_title(f"Per-module error of {r.precision.upper()} against FP32", fontsize=10, loc="left")
    _style(ax)
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color=AMP_COLOR, alpha=0.9, label="forward (output)"),
                       Patch(color=SCALE_COLOR, alpha=0.6, label="backward (gradients)"),
                       Patch(color=FAIL_COLOR, alpha=0.9, label="overflow / underflow inside")],
              fontsize=8, frameon=False, loc="lower right")
    return _png(fig)


def plot_pngs(r: CompareResult) -> dict[str, bytes]:
    """``{file name: PNG bytes}`` for the figures this result has (scale only for FP16, modules with explain)."""
    out = {"loss.png": _loss_plot(r)}
    scale = _scale_plot(r)
    if scale:
        out["scale.png"] = scale
    metric = _metric_plot(r)
    if metric:
        out["metric.png"] = metric
    out["throughput.png"] = _perf_plot(r)
    modules = _module_error_plot(r)
    if modules:
        out["modules.png"] = modules
    return out
