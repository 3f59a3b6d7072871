"""Arguments and helpers shared by several commands."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = ["add_device_arg", "add_precision_arg", "print_json", "console", "err_console"]


def add_device_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default=None, metavar="DEV",
                   help="musa, cuda, cuda:1, xpu, mps or cpu (default: $AMPKIT_DEVICE, else detected)")


def add_precision_arg(p: argparse.ArgumentParser, default: str | None = "auto") -> None:
    from ampkit.choices import PRECISION_CHOICES

    p.add_argument("--precision", default=default, choices=PRECISION_CHOICES, metavar="P",
                   help="auto | bf16 | fp16 | fp32")


def print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def console():
    from rich.console import Console

    return Console()


def err_console():
    from rich.console import Console

    return Console(stderr=True)
