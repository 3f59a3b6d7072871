"""Built-in tasks on data that ships with installed packages, and loading of the user's own.

A task is a model, a deterministic stream of batches, a loss and an evaluation:

>>> import torch, ampkit
>>> def make_task(seed: int = 0) -> ampkit.Task:
...     g = torch.Generator().manual_seed(seed)
...     x = torch.randn(512, 10, generator=g); y = (x.sum(1) > 0).long()
...     model = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
...     def batch(step):                      # the batch for optimizer micro-step `step`
...         i = torch.randint(0, 512, (64,), generator=torch.Generator().manual_seed(seed * 100003 + step))
...         return x[i], y[i]
...     def loss(model, b):                   # runs under the caller's autocast
...         return torch.nn.functional.cross_entropy(model(b[0]), b[1])
...     def evaluate(model, device):          # runs under autocast and no_grad
...         return {"accuracy": (model(x.to(device)).argmax(1).cpu() == y).float().mean().item()}
...     return ampkit.Task(name="toy", model=model, batch=batch, loss=loss, evaluate=evaluate,
...                        metric="accuracy", samples_per_batch=64)

Save that as ``mytask.py`` and run ``ampkit train --task mytask.py:make_task``.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from ampkit.errors import UsageError, first_line

__all__ = ["Task", "load_task", "BUILTIN_TASKS", "parse_task_args", "map_tensors", "import_factory"]

# A batch is a tensor, or tuples / lists / dicts of them, nested (HF style {"input_ids": ..., "labels": ...}).
Batch = Any


def map_tensors(batch: Batch, fn: Callable[[torch.Tensor], torch.Tensor]) -> Batch:
    """``fn`` on every tensor of a nested batch, keeping its structure (tuple, namedtuple, list, dict);
    anything else is passed through."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, dict):
        return type(batch)((k, map_tensors(v, fn)) for k, v in batch.items())
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(map_tensors(v, fn) for v in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(map_tensors(v, fn) for v in batch)
    return batch


@dataclass(kw_only=True)
class Task:
    """What ampkit trains.

    ``batch(step)`` returns the tensors of micro-step ``step`` (on the CPU, or already on the run's device
    when the factory took a ``device``) and must depend only on the task's seed and ``step``: that is what
    makes resume exact and FP32-vs-AMP comparisons fair.
    ``loss(model, batch)`` runs the forward pass and returns a scalar loss (called under autocast).
    ``evaluate(model, device)`` returns metrics (called under autocast and ``torch.no_grad``).
    ``make_optimizer(model)`` builds the optimizer (default: AdamW with ``lr``/``weight_decay``, fused
    where the device has it); ``make_scheduler(optimizer, total_steps)`` builds an LR scheduler that
    ``ampkit train`` steps once per optimizer step and keeps in its checkpoints (default: none).
    A batch may be a tensor or tuples, lists and dicts of tensors, nested.
    ``cpu_threads``: the intra-op threads a run of this task uses on the CPU (None: torch's default). A model too
    small to gain from a second thread sets 1: on a busy CPU, torch's threads waiting for a core cost many times
    the work (the built-in digits task; measured in ``benchmarks/cpu-compare-threads.json``). An
    ``OMP_NUM_THREADS`` the user set wins.
    ``graphable``: False when the model cannot be recorded as a device graph (it reads values on the host,
    or its shapes change from batch to batch); ``ampkit train`` then runs it eagerly and says why.

    >>> x, y = torch.randn(64, 4), torch.randn(64, 1)
    >>> task = ampkit.Task(name="toy", model=torch.nn.Linear(4, 1), batch=lambda step: (x, y),
    ...                    loss=lambda m, b: torch.nn.functional.mse_loss(m(b[0]), b[1]))
    >>> task.loss(task.model, task.batch(0)).shape
    torch.Size([])
    """

    name: str
    model: nn.Module
    batch: Callable[[int], Batch]
    loss: Callable[[nn.Module, Batch], torch.Tensor]
    evaluate: Callable[[nn.Module, torch.device], dict[str, float]] | None = None
    metric: str | None = None  # the key of evaluate() that compare judges
    higher_is_better: bool = True
    samples_per_batch: int = 1
    tokens_per_batch: int | None = None
    lr: float = 1e-3
    weight_decay: float = 0.0
    default_steps: int = 200
    flops_per_step: float | None = None  # forward+backward FLOPs of one batch, for MFU
    description: str = ""
    make_optimizer: Callable[[nn.Module], torch.optim.Optimizer] | None = None
    make_scheduler: Callable[[torch.optim.Optimizer, int], Any] | None = None
    graphable: bool = True
    cpu_threads: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


# name -> "module:factory"; factories take (seed: int, **options) -> Task.
BUILTIN_TASKS = {
    "digits": "ampkit.tasks.digits:make_task",
    "charlm": "ampkit.tasks.charlm:make_task",
    "llama": "ampkit.tasks.llama:make_task",
}


def parse_task_args(items: list[str] | None) -> dict[str, Any]:
    """``["d_model=256", "n_layers=4"]`` -> ``{"d_model": 256, "n_layers": 4}`` (ints, floats, bools kept)."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"bad --task-arg {item!r}: use KEY=VALUE, e.g. --task-arg n_layers=4")
        out[key.strip()] = _coerce(raw.strip())
    return out


def _coerce(raw: str) -> Any:
    low = raw.lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(raw)
        except ValueError:
            pass
    return raw


def _resolve_factory(spec: str) -> Callable[..., Task]:
    target = BUILTIN_TASKS.get(spec, spec)
    if ":" not in target:
        names = ", ".join(BUILTIN_TASKS)
        raise UsageError(f"unknown task {spec!r}: use a built-in ({names}) or FILE.py:factory / module:factory")
    return import_factory(target, what="task", returns="an ampkit.Task")


def import_factory(spec: str, *, what: str, returns: str) -> Callable[..., Any]:
    """The callable named by ``FILE.py:name`` or ``module:name``; a one-line :class:`UsageError` otherwise.

    ``what`` names the thing in messages (``"task"``, ``"callback"``), ``returns`` says what the
    factory must return.
    """
    mod_name, sep, attr = spec.rpartition(":")
    if not sep or not mod_name or not attr:
        raise UsageError(f"bad {what} {spec!r}: use FILE.py:factory or module:factory")
    if mod_name.endswith(".py") or os.sep in mod_name or "/" in mod_name:
        path = os.path.abspath(mod_name)
        if not os.path.isfile(path):
            raise UsageError(f"{what} file {mod_name!r} does not exist")
        module_name = f"ampkit_user_{what}_{abs(hash(path))}"
        spec_obj = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec_obj)
        sys.modules[module_name] = module
        sys.path.insert(0, os.path.dirname(path))
        try:
            spec_obj.loader.exec_module(module)
        except Exception as exc:  # noqa: BLE001 - the user's file: say what broke, no traceback
            raise UsageError(f"importing {mod_name} failed: {type(exc).__name__}: {exc}") from exc
        finally:
            sys.path.remove(os.path.dirname(path))
    else:
        try:
            module = importlib.import_module(mod_name)
        except ImportError as exc:
            raise UsageError(f"cannot import {what} module {mod_name!r}: {exc}") from exc
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise UsageError(f"{mod_name} has no callable {attr!r}: the factory returns {returns}")
    return factory


def _check_option_type(spec: str, key: str, value: Any, param: inspect.Parameter | None) -> None:
    """An option must have the type of the factory's default (an int where a float is expected is fine)."""
    if param is None or param.default is inspect.Parameter.empty or param.default is None:
        return
    want = type(param.default)
    ok = isinstance(value, want) or (want is float and isinstance(value, int) and not isinstance(value, bool))
    if want is int and isinstance(value, bool):
        ok = False
    if not ok:
        raise UsageError(f"task {spec!r}: option {key} takes {want.__name__} values (default {param.default!r}), "
                         f"got {value!r}")


def _factory_error(exc: Exception, spec: str, factory: Callable[..., Any]) -> UsageError:
    """One line for anything a task's factory raised: its own message and, for a user's factory, "in your
    factory SPEC" and the line of the factory's file where it was raised."""
    if spec in BUILTIN_TASKS:
        return UsageError(f"task {spec!r} could not be built: {first_line(exc, 300)}")
    try:
        home = os.path.abspath(inspect.getsourcefile(factory) or "")
    except TypeError:
        home = ""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if os.path.abspath(f.filename) == home]
    at = f", {os.path.basename(home)}:{frames[-1].lineno}" if frames else ""
    return UsageError(f"{first_line(exc, 300)} (in your factory {spec}{at}): fix the factory, or the options "
                      "given to it with --task-arg")


def load_task(spec: str | Callable[..., Task], *, seed: int = 0, options: dict[str, Any] | None = None,
              device: torch.device | str | None = None) -> Task:
    """Build a task from a built-in name, ``FILE.py:factory``, ``module:factory`` or the factory itself.

    The factory is called as ``factory(seed=seed, **options)`` (``seed`` only if it accepts one),
    under ``torch.manual_seed(seed)`` so that initial weights depend on the seed alone. A factory with
    a ``device`` parameter also gets ``device`` (ampkit passes the run's device), so it can size its
    model for the device or keep its data there; an explicit ``device`` option wins.

    >>> task = ampkit.load_task("digits", seed=0)
    >>> task.name, task.metric
    ('digits', 'accuracy')
    """
    if callable(spec):
        factory, spec = spec, getattr(spec, "__name__", type(spec).__name__)
    elif isinstance(spec, str):
        factory = _resolve_factory(spec)
    else:
        raise UsageError(f"a task is a spec string or a factory(seed=...) -> ampkit.Task, got {type(spec).__name__}")
    options = dict(options or {})
    params = inspect.signature(factory).parameters
    accepts_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
    if "seed" in params or accepts_kwargs:
        options["seed"] = seed
    unknown = [k for k in options if k not in params and not accepts_kwargs]
    if unknown:
        raise UsageError(f"task {spec!r} takes no option(s) {', '.join(unknown)}; it takes: "
                         f"{', '.join(p for p in params if p != 'seed') or 'none'}")
    for key, value in options.items():
        _check_option_type(spec, key, value, params.get(key))
    if device is not None and "device" in params and "device" not in options:
        # A torch.device, or its string where the factory's default is a string ("cpu").
        options["device"] = str(device) if isinstance(params["device"].default, str) else torch.device(device)
    torch.manual_seed(seed)
    try:
        task = factory(**options)
    except UsageError:
        raise  # already one line that says what to do
    except Exception as exc:  # noqa: BLE001 - the factory's own error: its message and where, no traceback
        raise _factory_error(exc, spec, factory) from exc
    if not isinstance(task, Task):
        raise UsageError(f"{spec} returned {type(task).__name__}, not an ampkit.Task")
    return task
