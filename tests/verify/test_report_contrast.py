"""Issue 45: every text colour of the report's CSS against the background it is drawn on: WCAG contrast >= 4.5:1.

The background of a rule without its own is the one of its container (the first part of the selector, e.g.
``.card`` for ``.card .k``); the verdict banner's text is checked on each verdict colour, and its ``code`` chips
(the "Next" commands) on their own background.
"""

from __future__ import annotations

import re

from ampkit.verify.report import _CSS


def _lum(hex_colour: str) -> float:
    h = hex_colour.lstrip("#")
    if len(h) == 3:
        h = "".join(c * 2 for c in h)
    chans = [int(h[i:i + 2], 16) / 255 for i in (0, 2, 4)]
    lin = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in chans]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def contrast(a: str, b: str) -> float:
    hi, lo = sorted((_lum(a), _lum(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def _rules() -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for sel, body in re.findall(r"([^{}]+)\{([^{}]*)\}", _CSS):
        props = dict((k.strip(), v.strip()) for k, _, v in (p.partition(":") for p in body.split(";") if ":" in p))
        for one in sel.split(","):
            out.setdefault(one.strip(), {}).update(props)
    return out


def _hex(v: str | None) -> str | None:
    m = re.fullmatch(r"#[0-9a-fA-F]{3}(?:[0-9a-fA-F]{3})?", (v or "").strip())
    return m.group(0) if m else None


def _pairs() -> list[tuple[str, str, str]]:
    rules = _rules()
    page_bg = _hex(rules["body"]["background"])
    pairs = []
    for sel, props in rules.items():
        fg = _hex(props.get("color"))
        if not fg:
            continue
        if sel == ".verdict":
            for kind in ("pass", "fail", "inconclusive"):
                pairs.append((f".verdict.{kind}", fg, _hex(rules[f".verdict.{kind}"]["background"])))
            continue
        own = _hex(props.get("background"))
        container = rules.get(sel.split()[0], {}) if " " in sel else {}
        bg = own or _hex(container.get("background")) or page_bg
        pairs.append((sel, fg, bg))
    return pairs


def test_contrast_formula_matches_wcag_reference_values():
    assert abs(contrast("#000", "#fff") - 21.0) < 1e-9
    assert abs(contrast("#777777", "#ffffff") - 4.48) < 0.01  # the classic just-failing grey


def test_every_text_colour_of_the_report_reads_at_4_5_to_1():
    pairs = _pairs()
    selectors = {sel for sel, _, _ in pairs}
    assert {".verdict.pass", ".verdict.fail", ".verdict.inconclusive", ".verdict code", "footer"} <= selectors
    low = [(sel, fg, bg, round(contrast(fg, bg), 2)) for sel, fg, bg in pairs if contrast(fg, bg) < 4.5]
    assert not low, f"text below 4.5:1 contrast: {low}"


def test_throughput_title_does_not_run_into_peak_memory(toy_compare):
    import dataclasses

    from ampkit.training.speed import speed_ratio
    from ampkit.verify.report_plots import _perf_figure

    r = dataclasses.replace(toy_compare, ratios={**toy_compare.ratios, "speedup": 1.21,
                                                 "speedup_spread": speed_ratio(
                                [96, 114, 121, 131, 446], [100] * 5).to_dict()},
                            memory={"fp32": 300 * 2**20, "amp": 200 * 2**20})
    fig = _perf_figure(r)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    texts = [t for ax in fig.axes for t in (ax.title, ax._left_title) if t.get_text()]
    if fig._suptitle is not None:
        texts.append(fig._suptitle)
    assert any("Peak memory" in t.get_text() for t in texts) and any("speed-up" in t.get_text() for t in texts)
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts]
    for i, (a, ba) in enumerate(boxes):
        for b, bb in boxes[i + 1:]:
            assert not ba.overlaps(bb), f"{a!r} overlaps {b!r}"
