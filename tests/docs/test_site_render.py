"""The docs site in a real browser: no code block is cut at its right edge (docs/extra.css wraps long lines)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile

import pytest

CHROMIUM = "/usr/bin/chromium"
# Pages with the longest lines: tables of generated output, findings with long messages, a long signature.
PAGES = ["commands/compare", "commands/doctor", "commands/diagnose", "reference/findings", "api/reference"]
# Counts the <pre><code> blocks whose content is wider than the block (what a reader could not see without
# scrolling sideways) and writes the count on <body> for --dump-dom to show.
PROBE = """<script>
window.addEventListener("load", () => {
  const cut = [...document.querySelectorAll("pre > code")].filter(c => c.scrollWidth > c.clientWidth + 1);
  document.body.setAttribute("data-cut", String(cut.length));
  document.body.setAttribute("data-blocks", String(document.querySelectorAll("pre > code").length));
});
</script>"""


def _cut(html_file) -> tuple[int, int]:
    profile = tempfile.mkdtemp(prefix="ampkit-chromium-")
    try:
        dom = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
             "--disable-component-update", f"--user-data-dir={profile}", "--virtual-time-budget=5000",
             "--window-size=1280,2000", "--dump-dom", html_file.as_uri()],
            capture_output=True, text=True, timeout=120, check=False).stdout
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    cut, blocks = re.search(r'data-cut="(\d+)"', dom), re.search(r'data-blocks="(\d+)"', dom)
    assert cut and blocks, f"the probe did not run in {html_file}: {dom[:300]}"
    return int(cut.group(1)), int(blocks.group(1))


@pytest.mark.browser
@pytest.mark.slow  # builds the site and starts chromium per page
@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="needs Debian's chromium (/usr/bin/chromium)")
def test_no_code_block_is_cut_at_the_right_edge(site):
    out, _ = site
    cut_without_css = 0
    for name in PAGES:
        page = out / name / "index.html"
        html = page.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>")
        probed = page.with_name("probe.html")
        probed.write_text(html, encoding="utf-8")
        cut, blocks = _cut(probed)
        assert blocks > 0 and cut == 0, f"{name}: {cut} of {blocks} code blocks are cut at 1280 px"
        # the same page without docs/extra.css: the probe sees the cut blocks (so it can fail)
        plain = page.with_name("probe-plain.html")
        plain.write_text(re.sub(r'<link[^>]+extra\.css[^>]*>', "", html), encoding="utf-8")
        cut_without_css += _cut(plain)[0]
    assert cut_without_css > 0, "without docs/extra.css some block should run past its edge"
