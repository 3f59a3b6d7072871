"""The partial parse (ampkit.migrate.skeleton) gives what the whole-file parse gives, byte for byte.

Every fixture and example script, and real files from installed packages (transformers' Trainer,
accelerate, Lightning, torch's own amp), are migrated both ways under every target: same code out, same
findings, same errors. The layout cases a skeleton must reproduce (one-line blocks, ``;``, ``elif``,
decorators, ``try``/``match``, no final newline, tabs) are checked by a round trip and by hypothesis.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import textwrap
from pathlib import Path

import libcst as cst
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ampkit.errors import AmpkitError
from ampkit.migrate import engine, skeleton
from ampkit.migrate._text import as_pairs, quote_counts
from ampkit.migrate._walk import walk

HERE = Path(__file__).parent
SOURCES = sorted([*HERE.glob("fixtures/**/*.in.py"), *HERE.glob("scripts/**/*.py")])
TARGETS = ("agnostic", "cuda", "musa")


def _both(code: str, target: str, name: str = "<t>"):
    out = []
    for partial in (False, True):
        try:
            r = engine._migrate(code, target, None, name, (2, 7), partial=partial)  # noqa: SLF001
            out.append((r.new_code, r.findings))
        except AmpkitError as exc:
            out.append(("error", str(exc)))
    return out


def _skeleton_of(code: str, target: str) -> skeleton.Skeleton | None:
    rules = engine._rules(code, target, None)  # noqa: SLF001
    return engine._skeleton_for(code, ast.parse(code), rules)  # noqa: SLF001


@pytest.mark.parametrize("target", TARGETS)
def test_fixtures_and_scripts_migrate_the_same_both_ways(target):
    used = 0
    for path in SOURCES:
        code = path.read_text()
        if not engine.may_match(code, target=target):
            continue
        full, partial = _both(code, target, str(path))
        assert partial == full, f"{path.relative_to(HERE)} under --target {target}"
        used += _skeleton_of(code, target) is not None
    assert used >= 20  # the partial parse really ran on these (not the whole-file fallback every time)


def _installed(*modules: str) -> list[Path]:
    paths = []
    for name in modules:
        spec = importlib.util.find_spec(name)
        paths.append(Path(spec.origin))
    return paths


# Real code we did not write, shipped inside the test extra's packages: AMP, devices, loops, checkpoints.
REAL = ("lightning.fabric.plugins.precision.amp", "lightning.fabric.fabric", "torch.amp.grad_scaler",
        "torch.cuda.amp.autocast_mode", "torch.distributed.fsdp.sharded_grad_scaler", "accelerate.state",
        "accelerate.utils.operations")
REAL_SLOW = ("transformers.trainer", "accelerate.accelerator", "lightning.pytorch.trainer.trainer",
             "transformers.training_args", "accelerate.utils.modeling", "torch.utils.data.dataloader",
             "lightning.pytorch.loops.training_epoch_loop", "accelerate.utils.dataclasses")


def _same_on(paths: list[Path]) -> int:
    used = 0
    for path in paths:
        code = path.read_text(encoding="utf-8")
        for target in TARGETS:
            if not engine.may_match(code, target=target):
                continue
            full, partial = _both(code, target, path.name)
            assert partial == full, f"{path} under --target {target}"
            used += _skeleton_of(code, target) is not None
    return used


def test_installed_packages_migrate_the_same_both_ways():
    assert _same_on(_installed(*REAL)) >= 8


@pytest.mark.slow
def test_big_installed_files_migrate_the_same_both_ways():
    assert _same_on(_installed(*REAL_SLOW)) >= 12


LAYOUT = '''\
import torch
import os, sys; import json
from torch.cuda.amp import autocast as ac, GradScaler

def untouched(a,  # a comment inside the header
              b):
    x = a + b; y = x * 2
    if x: y = 3
    else: y = 4
    return y

@staticmethod
@functools.cache
def decorated():
    \"\"\"A docstring.\"\"\"
    return 1

class Loop:
    def run(self, loader, model, opt):
        scaler = GradScaler()
        for step, batch in enumerate(loader):
            data = batch["x"]
            other = \\
                data
            with ac():
                loss = model(data)
            if step % 10 == 0:
                print(loss.item())
            elif step == 3:
                pass
            elif step == 4:
                z = 1
            else:
                w = 2
            try:
                q = json.dumps({"a": 1})
            except (ValueError, TypeError) as exc:
                raise RuntimeError("bad") from exc
            finally:
                os.sync()
            match data:
                case {"k": v}:
                    k = v
                case _:
                    torch.cuda.synchronize()
            scaler.scale(loss).backward()
            scaler.step(opt)
            loss = loss.item()
        else:
            done = True

if __name__ == "__main__":
\tpass_me = 1
\tLoop().run([], None, None)
x = 'single' ; y = "double"
last = "no final newline"'''


def test_layout_round_trip_and_same_both_ways():
    sk = _skeleton_of(LAYOUT, "musa")
    assert sk is not None and sk.kept_lines < sk.lines
    assert skeleton.splice(sk.text, sk) == LAYOUT  # placeholders back in: the original, byte for byte
    assert len(sk.text.split("\n")) == len(LAYOUT.split("\n"))  # every line where it was
    compile(sk.text, "skeleton", "exec")
    cst.parse_module(sk.text)
    for target in TARGETS:
        full, partial = _both(LAYOUT, target)
        assert partial == full and full[0] != "error", target
    assert "pass  # ampkit-skeleton:" in sk.text


# Pieces of real training code (and layouts the skeleton must reproduce), nested at random.
_SIMPLE = [
    "x = data['x']",
    "loss = model(x); y = 2",
    "print(loss.item())",
    "scaler.scale(loss).backward()",
    "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)",
    "scaler.unscale_(opt)",
    "scaler.step(opt)",
    "scaler = torch.cuda.amp.GradScaler()",
    "device = 'cuda' if torch.cuda.is_available() else 'cpu'",
    "model.cuda()",
    "ckpt = torch.load(path)",
    "torch.cuda.synchronize()",
    "raise ValueError('stop')",
    "sys.exit(1)",
    "x = x.half()",
    "autocast = None",
    "t = '''multi\nline'''",
    "k = f\"cuda:{rank}\"",
    "crit = nn.BCELoss()",
    "v = crit(a, b)",
    "# a comment line",
    "w = (1 +\n     2)",
]
_HEADS = [
    "for step, batch in enumerate(loader):",
    "while True:",
    "if step % 10 == 0:",
    "if use_amp:",
    "with torch.cuda.amp.autocast():",
    "with torch.autocast('cuda', dtype=torch.bfloat16):",
    "def train(model, opt, device='cuda'):",
    "class Trainer:",
    "try:",
]


def _program(draw_tree, depth: int = 0) -> list[str]:
    lines: list[str] = []
    for kind, payload in draw_tree:
        if kind == "s":
            lines.extend(payload.split("\n"))
        else:
            head, body = payload
            lines.append(head)
            inner = _program(body, depth + 1) or ["pass"]
            if all(line.lstrip().startswith("#") for line in inner):
                inner.append("pass")
            lines.extend("    " + line if line else line for line in inner)
            if head == "try:":
                lines += ["except (ValueError, TypeError) as exc:", "    raise"]
            elif head.startswith("if "):
                lines += ["else:", "    z = 0"]
    return lines


_trees = st.recursive(
    st.lists(st.tuples(st.just("s"), st.sampled_from(_SIMPLE)), min_size=1, max_size=4),
    lambda children: st.lists(st.one_of(
        st.tuples(st.just("s"), st.sampled_from(_SIMPLE)),
        st.tuples(st.just("b"), st.tuples(st.sampled_from(_HEADS), children))), min_size=1, max_size=4),
    max_leaves=14)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=_trees, final_newline=st.booleans(), target=st.sampled_from(TARGETS))
def test_random_programs_same_both_ways(tree, final_newline, target):
    body = "\n".join(_program(tree))
    code = "import sys\nimport torch\nfrom torch import nn\n" + body + ("\n" if final_newline else "")
    try:
        ast.parse(code)
    except SyntaxError:
        return  # `raise` outside an except, and the like, are not what this tests
    sk = _skeleton_of(code, target) if engine.may_match(code, target=target) else None
    if sk is not None:
        assert skeleton.splice(sk.text, sk) == code
        assert len(sk.text.split("\n")) == len(code.split("\n"))
    full, partial = _both(code, target)
    assert partial == full


def test_a_placeholder_a_rewrite_lost_falls_back_to_the_whole_file(monkeypatch):
    text = LAYOUT
    full, _ = _both(text, "musa")
    calls = []

    def lost(new_text, sk):
        calls.append(sk)
        return None

    monkeypatch.setattr(skeleton, "splice", lost)
    assert _both(text, "musa")[1] == full
    assert calls  # the skeleton was used, its splice failed, and the whole file gave the answer


@pytest.mark.parametrize("code", [
    "import torch\r\nx = torch.cuda.synchronize()\r\ny = 1\r\n",  # \r line ends
    "from torch import *\nx = cuda.synchronize()\ny = 1\n",  # torch may come through the star
    "import torch\n# ampkit-skeleton:0 in the text itself\nx = torch.cuda.synchronize()\ny = 1\n",
])
def test_whole_file_where_a_skeleton_cannot_serve(code):
    assert _skeleton_of(code, "musa") is None


def test_rebinding_an_imported_torch_name_is_kept():
    # `cuda = ...` holds no word of the agnostic rules, yet it decides what `cuda.amp.autocast` names
    code = textwrap.dedent("""\
        from torch import cuda
        def f(x):
            cuda = make_context()
            y = 1
            with cuda.amp.autocast():
                return x
        """)
    sk = _skeleton_of(code, "agnostic")
    assert sk is not None and "cuda = make_context()" in sk.text and "y = 1" not in sk.text
    full, partial = _both(code, "agnostic")
    assert partial == full


def _libcst_quotes(code: str) -> tuple[int, int]:
    counts = {'"': 0, "'": 0}

    class _Count(cst.CSTVisitor):
        def visit_SimpleString(self, node: cst.SimpleString) -> None:
            if node.quote in counts:
                counts[node.quote] += 1

    walk(cst.parse_module(code), [_Count()])
    return counts['"'], counts["'"]


def test_quote_counts_agree_with_libcst_on_real_files():
    for path in [*SOURCES, *_installed(*REAL)]:
        code = path.read_text(encoding="utf-8")
        assert quote_counts(code) == _libcst_quotes(code), path
    assert quote_counts('if"a"in s: x = rb"\\"" + f"{y}" + \'\'\'t\'\'\' + u\'z\'  # "c"\n') == (2, 1)
    assert quote_counts('f"{d[\'k\']:>{w}} {{no}}" + fr\'\'\'{g("a")}\'\'\'\n') == (1, 1)


_AS_NAME = re.compile(r"([A-Za-z_]\w*)\s+as\s+([A-Za-z_]\w*)")


def test_as_pairs_finds_what_the_regular_expression_finds():
    for path in [*SOURCES, *_installed(*REAL)]:
        code = path.read_text(encoding="utf-8")
        assert set(_AS_NAME.findall(code)) <= set(as_pairs(code)), path
    assert as_pairs("import torch.cuda.amp as amp, x as y\nhas z", dotted=True) == [("torch.cuda.amp", "amp"),
                                                                                   ("x", "y")]
    assert as_pairs("import pandas as pd") == [("pandas", "pd")]


SHARED = '''import os

def train(model, opt, data):
    a = 1
    b = 2
    from torch.amp import autocast; c = 3
    d = 4
    scaler = GradScaler()
    f = 6
    return a
'''


def test_an_import_sharing_a_line_is_kept_with_its_line():
    """`from torch... import x; c = 3`: the statements of one line stand or fall together, kept when any is."""
    sk = skeleton.build(SHARED, ast.parse(SHARED), ["GradScaler"], most=1.0)
    assert sk is not None and "    from torch.amp import autocast; c = 3\n" in sk.text
    assert "a = 1" not in sk.text and "scaler = GradScaler()" in sk.text
    assert skeleton.splice(sk.text, sk) == SHARED


def test_splice_rejects_a_doubled_and_a_lost_placeholder():
    sk = skeleton.build(SHARED, ast.parse(SHARED), ["GradScaler"], most=1.0)
    assert len(sk.pieces) == 3
    doubled_and_lost = sk.text.replace(f"# {skeleton.MARK}:1\n", f"# {skeleton.MARK}:0\n")
    assert doubled_and_lost != sk.text and skeleton.splice(doubled_and_lost, sk) is None
    lost = sk.text.replace(f"    pass  # {skeleton.MARK}:2\n", "")
    assert skeleton.splice(lost, sk) is None
    moved = sk.text.replace(f"    pass  # {skeleton.MARK}:1\n", f"    x = 1; pass  # {skeleton.MARK}:1\n")
    assert skeleton.splice(moved, sk) is None
