"""Run an unmodified training script under instrumentation, as ``python SCRIPT ARGS`` would.

The script runs in this interpreter with ``runpy.run_path(path, run_name="__main__")``, with
``sys.argv = [SCRIPT, *ARGS]`` and ``sys.path[0]`` = the script's folder; both are restored after.
It stops after ``steps`` optimizer steps (:class:`~ampkit.diagnose.instrument.StopRun`), at its
own end, at ``sys.exit``, or at an exception, which is mapped to a finding where possible.
"""

from __future__ import annotations

import functools
import os
import re
import runpy
import sys
import traceback
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from ampkit.diagnose.findings import Finding, fix_for
from ampkit.diagnose.fp16range import RangeReport
from ampkit.diagnose.instrument import Instrumentation
from ampkit.diagnose.stop import StopRun
from ampkit.diagnose.tracking import is_ampkit_file, short_path
from ampkit.errors import AmpkitError, UsageError, first_line

__all__ = ["DiagnoseResult", "diagnose_script", "fp16_range_script", "run_as_main", "error_line"]


@dataclass(frozen=True, kw_only=True)
class DiagnoseResult:
    """What a diagnose run found.

    ``steps``: optimizer steps the script took; ``stopped``: why it ended (``"finished"``,
    ``"step budget"``, ``"exit N"``, ``"exception"`` or the reason a finding stopped it);
    ``error``: the script's exception as one line, or None; ``traceback``: the script's own
    traceback (its frames, without ampkit's and runpy's), or None; ``checked``: False when the
    script reached no optimizer step and no enabled autocast region, so no check had anything to
    look at (no findings then means nothing, not "no defects").
    """

    script: str
    findings: tuple[Finding, ...]
    steps: int
    stopped: str
    error: str | None = None
    traceback: str | None = None
    checked: bool = True

    @property
    def ok(self) -> bool:
        return not self.findings

    def codes(self) -> list[str]:
        return [f.code for f in self.findings]

    def to_list(self) -> list[dict]:
        """The ``--json`` payload: a list of ``{code, message, where, fix, step}``."""
        return [f.to_dict() for f in self.findings]


def _resolve(path: str) -> str:
    if not path:
        raise UsageError("no script given: ampkit diagnose SCRIPT [ARGS...]")
    full = os.path.abspath(path)
    if not os.path.isfile(full):
        raise UsageError(f"script not found: {path}")
    return full


def run_as_main(path: str, args: list[str], inst: Any) -> tuple[str, BaseException | None]:
    """Run ``path`` as ``python path *args`` would, inside ``inst`` (a context manager with ``finish()``: the
    instrumentation, or parity's recording); returns (how it stopped, the script's exception or None)."""
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = [path, *args]
    sys.path[0:1] = [os.path.dirname(path)] if sys.path else [os.path.dirname(path)]
    try:
        with warnings.catch_warnings(), inst:
            # torch warns that torch.compile(module) fires global hooks twice: those hooks are ours.
            warnings.filterwarnings("ignore", message=r"Using `torch\.compile\(module\)` when there are global hooks")
            try:
                runpy.run_path(path, run_name="__main__")
                stopped, error = "finished", None
            except StopRun as stop:
                stopped, error = str(stop) or "stopped", None
            except SystemExit as exc:
                code = exc.code
                stopped = f"exit {_exit_status(code)}" if code not in (None, 0) else "finished"
                error = exc if code not in (None, 0) else None
            except Exception as exc:  # noqa: BLE001 - the script's error is a result, not our crash
                stopped, error = "exception", exc
            inst.finish()
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    return stopped, error


def _exit_status(code) -> int:
    """The process exit status ``sys.exit(code)`` gives: an int as is, a message (printed) as 1."""
    return code if isinstance(code, int) else 1


def script_traceback(exc: BaseException, is_user_file) -> str:
    """The traceback Python would print for the script: from its first frame on (runpy and ampkit's
    runner frames above it dropped, and the frames of ampkit's wrappers inside it), with the
    exception line(s) at the end."""
    tb = exc.__traceback__
    while tb is not None and not is_user_file(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    frames = [f for f in traceback.extract_tb(tb) if not is_ampkit_file(f.filename)] if tb is not None else []
    lines = ["Traceback (most recent call last):\n"] if frames else []
    lines += traceback.format_list(frames)
    lines += traceback.format_exception_only(type(exc), exc)
    return "".join(lines).rstrip("\n")


def diagnose_script(path: str, args: list[str] | tuple[str, ...] = (), steps: int = 50,
                    device: str | None = None) -> DiagnoseResult:
    """Run ``python path *args`` in this interpreter, at most ``steps`` optimizer steps, and return findings.

    ``device`` names the device to quote in rerun hints (``cuda``, ``musa``) when the script's own
    tensors do not show it. Raises :class:`~ampkit.errors.UsageError` for a missing script or bad steps.

    >>> result = diagnose_script("train.py", ["--epochs", "1"], steps=20)   # doctest: +SKIP
    >>> [f.code for f in result.findings]                                    # doctest: +SKIP
    ['clip-before-unscale']
    """
    if steps < 1:
        raise UsageError(f"--steps must be at least 1, got {steps}")
    full = _resolve(path)
    inst = Instrumentation(os.path.dirname(full), steps=steps, mode="diagnose")
    stopped, error = run_as_main(full, list(args), inst)
    tb = None
    if error is not None:
        mapped = _map_exception(error, inst, device)
        if mapped is not None and not inst.has(mapped.code):
            inst.add(mapped, key=(mapped.code,))
        if not isinstance(error, SystemExit):
            tb = script_traceback(error, inst.user.is_user_file)
    return DiagnoseResult(script=path, findings=tuple(inst.findings), steps=inst.step, stopped=stopped,
                          error=None if error is None else error_line(error), traceback=tb,
                          checked=inst.step > 0 or bool(inst.step_dtypes_seen))


def error_line(error: BaseException) -> str:
    """The script's exception as one line (``SystemExit: CODE`` for an exit)."""
    if isinstance(error, SystemExit):
        return f"SystemExit: {error.code}"
    return first_line(error)


def fp16_range_script(path: str, args: list[str] | tuple[str, ...] = (), steps: int = 5) -> tuple[RangeReport, str | None]:
    """Run the script in FP32 (autocast and GradScaler forced off) for ``steps`` optimizer steps and
    predict FP16 overflow/underflow per module. Returns the report and the script's error, if any."""
    if steps < 1:
        raise UsageError(f"--steps must be at least 1, got {steps}")
    full = _resolve(path)
    inst = Instrumentation(os.path.dirname(full), steps=steps, mode="range")
    _, error = run_as_main(full, list(args), inst)
    return inst.recorder.report(), None if error is None else first_line(error)


_DEVICE_ERROR_MARKERS = ("cuda error", "musa error", "device-side assert", "illegal memory access",
                         "cublas_status", "cudnn_status", "mudnn", "launch failure", "invalid device function")


def _script_where(exc: BaseException, inst: Instrumentation) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if inst.user.is_user_file(f.filename)]
    if not frames:
        return "(not in the script's code)"
    return f"{short_path(frames[-1].filename)}:{frames[-1].lineno}"


# oneDNN (the CPU's kernels for LSTM/GRU, some convolutions) has no FP16 primitive for some ops.
_NO_KERNEL_MARKERS = ("not implemented for 'bfloat16'", "not implemented for 'half'",
                      "could not create a primitive descriptor")


def _map_exception(exc: BaseException, inst: Instrumentation, device: str | None) -> Finding | None:
    """Turn the script's exception into a finding: a known AMP defect where the message says so,
    else ``script-error`` with the rerun hint for device errors."""
    from ampkit.device import Device, detect_device, parse_device

    text = str(exc)
    low = text.lower()
    where = _script_where(exc, inst)
    line = first_line(exc)
    if isinstance(exc, SystemExit):
        status = _exit_status(exc.code)
        said = f"sys.exit({exc.code!r})" if isinstance(exc.code, int) else f"sys.exit({str(exc.code)[:120]!r})"
        return Finding(code="script-exit", message=f"the script called {said}: exit status {status}, after "
                       f"{inst.step} optimizer step(s)", where=where, fix=fix_for("script-exit"), step=inst.step)
    if "attempting to unscale fp16 gradients" in low:
        return Finding(code="fp16-params-with-scaler", message=f"the script raised {line}", where=where,
                       fix=fix_for("fp16-params-with-scaler"), step=inst.step)
    if "binary_cross_entropy" in low and "autocast" in low:
        return Finding(code="bce-under-autocast", message=f"the script raised {line}: CUDA and MUSA autocast refuse "
                       "`binary_cross_entropy` / `nn.BCELoss` as unsafe (a sigmoid in low precision saturates to 0 "
                       "or 1 and the log gives inf)", where=where, fix=fix_for("bce-under-autocast"), step=inst.step)
    if "no inf checks were recorded" in low and inst.has("zero-grad-between-backward-and-step"):
        return None  # explained: the gradients were cleared before scaler.step
    amp = _amp_error(exc, low, line, where, inst)
    if amp is not None:
        return amp
    low_dtypes = {d for _, d in inst.step_dtypes_seen}
    if any(m in low for m in _NO_KERNEL_MARKERS) and (low_dtypes or "not implemented for" in low):
        return Finding(code="dtype-unsupported",
                       message=f"an op has no kernel for this dtype on this device: {line}", where=where,
                       fix=_dtype_fix(low_dtypes, inst, line), step=inst.step)
    try:
        named = next((Device(t, 0) for t in ("musa", "cuda") if f"{t} error" in low), None)
        seen = next((Device(t, 0) for t in sorted(inst.devices_seen) if t != "cpu"), None)
        dev = parse_device(device) if device else named or seen or detect_device()
    except (AmpkitError, RuntimeError, ValueError):  # a hint must not fail the report
        dev = Device("cpu")
    device_error = any(m in low for m in _DEVICE_ERROR_MARKERS)
    hint = dev.rerun_hint()
    fix = (f"device errors are reported late and at the wrong line: rerun with `{hint} python SCRIPT ...` "
           "to stop at the failing op and see the C++ stack" if device_error else fix_for("script-error"))
    return Finding(code="script-error", message=f"the script raised {line}", where=where, fix=fix, step=inst.step)


_UPDATE_MISSING = ("unscale_() has already been called on this optimizer since the last update()",
                   "step() has already been called since the last update()")
_DTYPE_MISMATCH = ("same dtype", "expected scalar type", "but found", "dtype mismatch", "expected both")


def _amp_error(exc: BaseException, low: str, line: str, where: str, inst: Instrumentation) -> Finding | None:
    """torch's own AMP errors as AMP advice: a GradScaler stepped twice without ``update()``, and a
    custom ``autograd.Function`` whose backward (run outside autocast) mixes dtypes."""
    after_step = "unscale_() is being called after step()" in low and inst.scaler_checks.update_missing()
    if after_step or any(m.lower() in low for m in _UPDATE_MISSING):
        return Finding(code="scaler-update-missing",
                       message=f"the script raised {line.rstrip('.')}: the GradScaler stepped (or unscaled) this optimizer again "
                               "without `scaler.update()` after its previous step", where=where,
                       fix=fix_for("scaler-update-missing"), step=inst.step)
    if not any(m in low for m in _DTYPE_MISMATCH):
        return None
    fn = _failing_function(exc)
    if fn is None:
        return None
    name, decorated = fn
    if decorated or not inst.step_dtypes_seen:
        return None
    return Finding(code="autograd-function-without-custom-fwd",
                   message=f"the backward of the custom autograd.Function `{name}` raised {line}: its forward ran "
                           "under autocast (low-precision outputs), its backward runs outside autocast on FP32 saved "
                           "tensors, and the dtypes meet in one op", where=where,
                   fix=fix_for("autograd-function-without-custom-fwd"), step=inst.step)


def _failing_function(exc: BaseException) -> tuple[str, bool] | None:
    """``(class name, forward decorated with custom_fwd)`` of the custom ``autograd.Function`` whose
    ``backward`` raised ``exc`` (its frame has the ``ctx`` autograd passes), or None."""
    tb = exc.__traceback__
    found = None
    while tb is not None:
        frame = tb.tb_frame
        ctx = frame.f_locals.get("ctx") if frame.f_code.co_name == "backward" else None
        cls = getattr(type(ctx), "_forward_cls", None) if ctx is not None else None
        if isinstance(cls, type) and issubclass(cls, torch.autograd.Function):
            found = (cls.__name__, hasattr(cls.forward, "__wrapped__"))
        tb = tb.tb_next
    return found


def _dtype_fix(low_dtypes: set, inst: Instrumentation, line: str = "") -> str:
    """Name the dtype that works here: BF16 when the run used FP16, this device has BF16 (the one
    precision decision, :func:`ampkit.device.policy.supports`) and the failing op runs in BF16 here (a
    CPU without AVX-512 has neither an FP16 nor a BF16 LSTM), else the registry's generic fix."""
    from ampkit.device.policy import supports

    dev = next((t for t in sorted(inst.devices_seen) if t != "cpu"), "cpu")
    rnn = _RNN_PRIMITIVE.search(line)
    if rnn is not None and not _bf16_rnn_runs(rnn.group(1), dev):
        return (f"run the {rnn.group(1)} in FP32: call it under `with torch.autocast({dev!r}, enabled=False):` "
                "with FP32 inputs (`x.float()`), the rest of the model keeps autocast: this device has neither "
                "an FP16 nor a BF16 kernel for it (a CPU without AVX-512 has none)")
    if torch.float16 in low_dtypes and supports("bf16", dev):
        return (f"use BF16 here: `torch.autocast({dev!r}, dtype=torch.bfloat16)` (no GradScaler needed; "
                f"`ampkit train --precision bf16`): this device has no FP16 kernel for the op")
    return fix_for("dtype-unsupported")


# oneDNN names the recurrent primitive it could not build ("... for the LSTM forward propagation primitive").
_RNN_PRIMITIVE = re.compile(r"\b(LSTM|GRU|RNN)\b")


@functools.lru_cache(maxsize=None)
def _bf16_rnn_runs(kind: str, dev: str) -> bool:
    """Whether a recurrent layer of ``kind`` (whose kernels differ by CPU) runs under BF16 autocast on ``dev``."""
    layer = getattr(torch.nn, kind)(4, 4).to(dev)
    try:
        with torch.autocast(dev, dtype=torch.bfloat16):
            layer.forward(torch.zeros(1, 2, 4, device=dev))  # forward, not __call__: no script hook sees it
    except RuntimeError:
        return False
    return True
