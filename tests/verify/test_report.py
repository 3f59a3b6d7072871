"""The HTML report: self-contained, verdict first, every plot embedded; rendered in a real chromium."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"


def _html(result) -> str:
    return Path(result.report).read_text(encoding="utf-8")


def test_report_is_self_contained(toy_compare, harmful_compare):
    for result in (toy_compare, harmful_compare):
        page = _html(result)
        assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page), "nothing may load from the network"
        assert "<link" not in page and "@import" not in page
        imgs = re.findall(r'<img[^>]+src="([^"]+)"', page)
        assert imgs and all(src.startswith("data:image/png;base64,") for src in imgs)
        verdict_at = page.index('id="verdict"')
        assert verdict_at < page.index("<img")  # the verdict comes first
        folder = Path(result.report).parent
        for png in folder.glob("*.png"):
            assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_content(toy_compare, harmful_compare):
    ok, bad = _html(toy_compare), _html(harmful_compare)
    assert ">PASS<" in ok and 'class="verdict pass"' in ok
    assert 'id="effects"' in ok and "late training loss" in ok and "would decide" in ok  # the paired tests
    assert 'id="effects"' not in bad  # a hard failure (non-finite) has no statistics to show
    assert ">FAIL<" in bad and "non-finite" in bad and "scale collapsed" in bad
    assert 'id="img-scale"' in bad and 'id="img-scale"' not in ok  # the scale plot is for FP16 only
    assert "n/a on CPU" in ok and 'id="audit"' in ok


def _chromium(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    profile = tempfile.mkdtemp(prefix="ampkit-chromium-")
    try:
        return subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", "--virtual-time-budget=5000", *args],
            capture_output=True, text=True, timeout=120, cwd=cwd)
    finally:
        shutil.rmtree(profile, ignore_errors=True)


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="needs Debian's chromium (/usr/bin/chromium)")
@pytest.mark.parametrize("which", ["digits_compare", "harmful_compare"])
def test_report_renders_in_chromium(which, request, tmp_path):
    result = request.getfixturevalue(which)
    url = Path(result.report).resolve().as_uri()
    dom = _chromium("--dump-dom", "--window-size=1280,2400", url, cwd=tmp_path).stdout
    body = re.search(r"<body[^>]*>", dom)
    assert body, dom[:500]
    attrs = dict(re.findall(r'([\w-]+)="([^"]*)"', body.group(0)))
    assert attrs.get("data-report-ready") == "1", "the page's own script did not run"
    assert attrs["data-verdict"] == result.verdict
    assert int(attrs["data-images-total"]) >= 3
    assert attrs["data-images-loaded"] == attrs["data-images-total"], "an image did not decode"
    assert 'data-loaded="0"' not in dom
    assert f">{result.verdict.upper()}<" in dom

    # as tall as the page itself (the page's script measured it), so the screenshot has no empty tail
    height = min(max(int(attrs.get("data-height", 2400)), 600), 6000)
    shot = tmp_path / "report.png"
    _chromium(f"--screenshot={shot}", f"--window-size=1280,{height}", url, cwd=tmp_path)
    assert shot.exists() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    # docs/report-screenshot.png is made by docs/gen_outputs.py, from the run its compare page shows
