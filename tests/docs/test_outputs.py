"""The example outputs of the docs are what the product prints now (docs/gen_outputs.py writes them).

A block whose command takes more than ~20 s on a 2-core CPU is marked ``slow`` in its page and here; CI runs
the slow set too. After a change that alters what a command prints: ``python docs/gen_outputs.py ID``.
"""

from __future__ import annotations

import difflib
import importlib.util
import re
import sys

import pytest

from docs_examples import ROOT


def _gen():
    spec = importlib.util.spec_from_file_location("gen_outputs", ROOT / "docs" / "gen_outputs.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module       # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


gen = _gen()
BLOCKS = gen.all_blocks()


@pytest.fixture(scope="module")
def cpu():
    return gen.cpu_name()


@pytest.mark.parametrize("block", [pytest.param(b, marks=[pytest.mark.slow] if b.slow else [], id=b.id)
                                   for b in BLOCKS])
def test_the_shown_output_is_what_the_product_prints(block, cpu, tmp_path):
    now = gen.normalize(gen.run(block, tmp_path), cpu)
    shown = gen.normalize(block.output, cpu)
    assert shown == now, (
        f"{block.page.relative_to(ROOT)} [{block.id}] shows an older output of `{block.command}`; "
        f"regenerate it: python docs/gen_outputs.py {block.id}\n"
        + "\n".join(difflib.unified_diff(shown, now, "shown", "now", lineterm="")))


def test_the_pages_show_generated_outputs():
    ids = [b.id for b in BLOCKS]
    assert len(ids) == len(set(ids)), "two output blocks share an ID"
    assert {"compare-digits", "compare-script", "doctor-cpu", "diagnose-absorbed", "compare-explain",
            "diagnose-walkthrough"} <= set(ids)
    shot = [b for b in BLOCKS if b.screenshot]
    assert [b.id for b in shot] == ["compare-digits"], "one block makes docs/report-screenshot.png"
    for block in BLOCKS:
        assert block.output.strip() and block.output != "(generated)", f"{block.id}: run docs/gen_outputs.py"


_FENCE = re.compile(r"^\s*(`{3,})")


def test_every_shown_ampkit_output_is_generated_or_says_where_it_was_recorded():
    # A console block that shows ampkit's output (a `$ ampkit` line followed by printed lines) is either an
    # output block, or says just before it where it was recorded (`<!-- recorded: WHERE -->`: a GPU, a
    # simulated MUSA card, a fragment): no page shows an older product without saying so.
    loose = []
    for page in gen.pages():
        if page.name == "changelog.md":
            continue
        lines = page.read_text(encoding="utf-8").splitlines()
        i = 0
        while i < len(lines):
            if not _FENCE.match(lines[i]):
                i += 1
                continue
            j = i + 1
            while j < len(lines) and not _FENCE.match(lines[j]):
                j += 1
            body = lines[i + 1:j]
            shows = any(line.lstrip().startswith("$ ampkit") for line in body) and \
                any(line.strip() and not line.lstrip().startswith(("$ ", "#")) for line in body)
            before = next((lines[k].strip() for k in range(i - 1, -1, -1) if lines[k].strip()), "")
            if shows and not before.startswith(("<!-- output:", "<!-- recorded:")):
                loose.append(f"{page.relative_to(ROOT)}:{i + 1}")
            i = j + 1
    assert not loose, f"ampkit output neither generated nor marked as recorded: {loose}"


TABLE = """\
summary
┏━━━━━━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━━┓
┃ quantity     ┃ value              ┃
┡━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━┩
│ final acc    │ 0.9731             │
│ samples/s    │ 1,070 speed-up     │
│              │ 0.90x (0.86x-1.01x │
│              │ : within noise)    │
└──────────────┴────────────────────┘
PASS: BF16 is within the tolerance of FP32 (paired over 3 seeds)
note: speed-up 0.90x (0.86x-1.01x over 3 seeds: within noise): the seeds do not agree on faster or slower on this
machine
note: FP16 was slower than FP32 here: samples/s 0.49x (0.49x-0.49x over 2
seeds)
"""


def test_normalize_masks_noise_and_wrapping_but_not_words_or_rows():
    base = gen.normalize(TABLE)
    # other numbers, a re-wrapped cell, the speed-up decided instead of within noise: the same
    assert gen.normalize(TABLE.replace("0.9731", "0.96").replace("1,070", "998").replace("3 seeds", "4 seeds")) == base
    rewrapped = TABLE.replace("│ 1,070 speed-up     │\n│              │ 0.90x (0.86x-1.01x │",
                              "│ 1,070              │\n│              │ speed-up 0.90x     │\n"
                              "│              │ (0.86x-1.01x       │")
    assert rewrapped != TABLE and gen.normalize(rewrapped) == base
    decided = TABLE.replace("│              │ : within noise)    │", "│              │ )                  │")
    decided = decided.replace("note: speed-up 0.90x (0.86x-1.01x over 3 seeds: within noise): the seeds do not agree "
                              "on faster or slower on this\nmachine\n", "")
    assert decided != TABLE and gen.normalize(decided) == base
    faster = TABLE.replace("note: FP16 was slower than FP32 here: samples/s 0.49x (0.49x-0.49x over 2\nseeds)\n", "")
    assert faster != TABLE and gen.normalize(faster) == base
    # a changed word, a changed row, a column more: different
    assert gen.normalize(TABLE.replace("PASS", "FAIL")) != base
    assert gen.normalize(TABLE.replace("final acc ", "final loss")) != base
    assert gen.normalize(TABLE.replace("│ final acc    │ 0.9731             │\n", "")) != base
    wider = "\n".join(line + (" x │" if line.startswith("│") else "") for line in TABLE.splitlines())
    assert gen.normalize(wider) != base


def test_the_cpu_name_is_masked():
    assert gen.normalize("on AMD EPYC (cpu)", "AMD EPYC") == gen.normalize("on Intel Xeon (cpu)", "Intel Xeon")


def test_blocks_need_a_command_and_a_close(tmp_path):
    page = tmp_path / "page.md"
    with pytest.raises(ValueError, match="no `<!-- /output -->`"):
        gen.blocks(page, "<!-- output: x -->\n```console\n$ ampkit doctor\nout\n```\n")
    with pytest.raises(ValueError, match="first line is `\\$ COMMAND`"):
        gen.blocks(page, "<!-- output: x -->\n```console\nout\n```\n<!-- /output -->\n")
    with pytest.raises(ValueError, match="unknown option"):
        gen.blocks(page, "<!-- output: x fast -->\n```console\n$ ampkit doctor\nout\n```\n<!-- /output -->\n")
    (block,) = gen.blocks(page, "<!-- output: x slow exit file=a/b.py:train.py -->\n```console\n"
                                "$ ampkit doctor  # why\nout\n```\n<!-- /output -->\n")
    assert (block.command, block.output, block.slow, block.exit, block.files) == \
        ("ampkit doctor", "out", True, True, [("a/b.py", "train.py")])
    text = "a\n<!-- output: x -->\n```console\n$ ampkit doctor\nold\n```\n<!-- /output -->\nb\n"
    (block,) = gen.blocks(page, text)
    assert gen.render(text, block, "new\nlines") == \
        "a\n<!-- output: x -->\n```console\n$ ampkit doctor\nnew\nlines\n```\n<!-- /output -->\nb\n"
