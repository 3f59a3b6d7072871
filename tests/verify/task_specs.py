"""The task specs (FILE.py:factory) the tests in tests/verify compare, importable by name: ``from task_specs import
TOY``. A module of its own, not the conftest: every tests/*/conftest.py is a module named ``conftest``, and when
pytest loads two of them up front (``pytest tests/verify tests/docs``) the last one shadows the other."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).parent
TOY = str(HERE.parent / "toy_task.py") + ":make_task"
HARMFUL = str(HERE / "harmful_task.py") + ":make_task"
OVERFLOW_NORM = str(HERE / "overflow_norm_task.py") + ":make_task"
