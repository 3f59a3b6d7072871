"""Arguments and helpers shared by several commands."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

__all__ = ["add_device_arg", "add_precision_arg", "add_fp32_modules_arg", "add_fp8_recipe_arg", "print_json", "console",
           "err_console", "check_writable"]

PIPE_WIDTH = 200  # columns of a table when the output is not a terminal (and $COLUMNS is not set)


def add_device_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default=None, metavar="DEV",
                   help="musa, cuda, cuda:1, xpu, mps or cpu (default: $AMPKIT_DEVICE, else detected)")


def add_precision_arg(p: argparse.ArgumentParser, default: str | None = "auto") -> None:
    from ampkit.choices import PRECISION_CHOICES, precision_name

    # type= runs before choices= is checked: "BF16" and "bfloat16" mean what they mean in the Python API.
    p.add_argument("--precision", default=default, type=precision_name, choices=PRECISION_CHOICES, metavar="P",
                   help=" | ".join(PRECISION_CHOICES) + " (any case; bfloat16/half/float32 also accepted)")


def add_fp32_modules_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fp32-modules", default=None, metavar="NAMES",
                   help="keep these modules in FP32 under autocast: comma-separated names, globs ('*.norm') or "
                        "presets (preset:norm, preset:softmax, preset:loss)")


def add_weights_arg(p: argparse.ArgumentParser) -> None:
    from ampkit.choices import WEIGHTS

    p.add_argument("--weights", default=WEIGHTS[0], choices=WEIGHTS,
                   help="how the (AMP) run stores its weights: fp32 (default; autocast casts per op), bf16 (BF16 "
                        "weights plus a 16-bit remainder each: exact FP32 updates in 2+2 bytes, --precision bf16), "
                        "bf16-pure (BF16 weights, no master copy: what model.to(torch.bfloat16) does, to measure it)")


def add_fp8_recipe_arg(p: argparse.ArgumentParser, what: str, *, several: bool = False) -> None:
    from ampkit.choices import FP8_LAYERS, FP8_RECIPES

    extra: dict[str, Any] = {"nargs": "+", "metavar": "RECIPE"} if several else {}
    p.add_argument("--fp8-recipe", default=[FP8_RECIPES[0]] if several else FP8_RECIPES[0], choices=FP8_RECIPES,
                   **extra,
                   help=f"{what}: torchao's scaling recipe ({FP8_RECIPES[0]} is fastest on Hopper, "
                        f"{FP8_RECIPES[2]} the most accurate)"
                        + ("; several: one set of fp8 rows each" if several else ""))
    p.add_argument("--fp8-layers", default=FP8_LAYERS[0], choices=FP8_LAYERS,
                   help="paying (default): only the linear layers FP8 is predicted to make faster, by a cost model "
                        "measured on this card (a probe at first use, cached); eligible: every layer the shape "
                        "filter allows, speed not checked")


def check_writable(path: str, flag: str) -> None:
    """A one-line UsageError when ``path`` cannot be written (checked by opening it, before the work; a file
    that was not there is removed again)."""
    from ampkit.errors import UsageError

    existed = os.path.exists(path)
    if os.path.isdir(path):
        raise UsageError(f"{flag} {path} is a folder: give a file name (e.g. {os.path.join(path, 'bench.json')})")
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as exc:
        raise UsageError(f"{flag} {path} cannot be written ({exc.strerror}): pick a writable place") from None
    if not existed:
        os.remove(path)


def print_json(obj: Any, what: str = "result") -> None:
    """``obj`` as JSON on stdout; when stdout cannot take it (a full disk), an OutputError that says where the
    JSON was kept instead (a temporary file), so that a result measured for minutes is not lost."""
    from ampkit.cli.output import OutputError, keep_elsewhere

    try:
        json.dump(obj, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
        sys.stdout.flush()
    except OutputError as exc:
        kept = keep_elsewhere(obj, what)
        raise OutputError(f"{exc}; " + (f"the JSON {what} is saved in {kept}" if kept else
                                        f"the JSON {what} could not be saved elsewhere either")) from None


def _console(stderr: bool):
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty() or os.environ.get("COLUMNS"):
        return Console(stderr=stderr)
    # A pipe or a log file: rich would wrap at 80 columns and break log lines in two; lines stay whole.
    return Console(stderr=stderr, width=PIPE_WIDTH, soft_wrap=True)


def console():
    """Rich console on stdout (whole lines when it is not a terminal)."""
    return _console(stderr=False)


def err_console():
    """Rich console on stderr (whole lines when it is not a terminal)."""
    return _console(stderr=True)


class ProgressView:
    """A rich progress bar on stderr fed by a library's progress callback (``__call__(event)``);
    subclasses render their events. With ``enabled=False`` (not a TTY, ``--json``) no bar is drawn."""

    def __init__(self, enabled: bool, *, counter: str = "count") -> None:
        self.enabled = enabled
        self.counter = counter  # "count": done/total; "elapsed": time spent
        self.err = err_console()
        self.progress = None

    def __enter__(self):
        if self.enabled:
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                                       TimeRemainingColumn)

            middle = MofNCompleteColumn() if self.counter == "count" else TimeElapsedColumn()
            self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), middle,
                                     TimeRemainingColumn(), TextColumn("{task.fields[info]}"), console=self.err)
            self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        if self.progress is not None:
            self.progress.__exit__(*exc)

    def __call__(self, ev: dict) -> None:  # pragma: no cover - subclasses render
        raise NotImplementedError
