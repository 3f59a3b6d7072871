"""Checks that diagnose runs it like `python argv_probe.py ARGS`: __main__, sys.argv, sys.path[0]."""
import os
import sys

assert __name__ == "__main__", __name__
assert os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)), sys.path[0]
if sys.argv[1:] != ["--lr", "0.1", "pos"]:
    sys.exit(f"bad argv {sys.argv!r}")
