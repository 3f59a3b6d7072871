"""``ampkit audit SCRIPT``: the dtype of every op of a script's first AMP step, in the script's own process.

This module is also the child process of an audited run: ``python -m ampkit.verify.script_audit SPEC.json``
is :func:`ampkit.diagnose.script_run.main` with a :class:`FirstStepAudit` as its recorder.

:class:`FirstStepAudit` reuses :mod:`ampkit.verify.record` (the dispatch mode that sees each aten op after
autocast cast its inputs, and the function mode that notes whether autocast was on). Its modes are pushed
at the first forward of a root module (global forward hooks name the modules: the dotted names of the
first root's ``named_modules()``) in **the first step in which autocast is enabled**, and popped at that
step's optimizer step, so what the script does before (building data, a model, an optimizer, an FP32 phase
such as the PyTorch AMP recipe's first loop) is not recorded; the backward the script calls is
(``"backward"``). A step is recorded when autocast is on at its first forward, or was on anywhere in an
earlier step (a wrapper that enters autocast inside the model's forward, as Lightning Fabric does); in the
FP32 run (``switch.mode == "fp32"``) the first step is. The run stops once that step is recorded; a script
whose first ``SEARCH_STEPS`` steps never enabled autocast is reported (``result()["unrecorded"]``).
Installed by :func:`ampkit.diagnose.script_run.main` inside a :class:`~ampkit.diagnose.switch.Switch`.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import torch

from ampkit.verify.record import _AutocastState, _first_tensor, _Recorder, _State, _dtype_name

if TYPE_CHECKING:
    from ampkit.diagnose.switch import Switch

__all__ = ["FirstStepAudit", "SEARCH_STEPS"]

SEARCH_STEPS = 1000  # optimizer steps an audit waits for autocast to be enabled


class FirstStepAudit:
    def __init__(self) -> None:
        self.state = _State({}, "")
        self.state.recording = False
        self.root: torch.nn.Module | None = None
        self.device_type = "cpu"
        self.modes: list[Any] = []
        self.done = False
        self.output_dtype: str | None = None
        self._handles: list[Any] = []
        self._names: dict[int, tuple[str, str]] = {}
        self.switch: "Switch | None" = None  # set by script_run.main: its mode says whether autocast can come
        self.autocast_seen = False  # autocast was on in a forward of an earlier step
        self.audited_step: int | None = None

    def install(self) -> None:
        import torch.optim.optimizer as optim_mod

        mm = torch.nn.modules.module
        self._handles = [mm.register_module_forward_pre_hook(self._pre),
                         mm.register_module_forward_hook(self._post, always_call=True),
                         optim_mod.register_optimizer_step_pre_hook(lambda *a: self._pause())]

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        self._stop()

    def _pre(self, module, args) -> None:
        st = self.state
        if self.done or torch.compiler.is_compiling():
            return
        if self.root is None:
            self.root = module
            self._names = {id(m): (name or f"({type(m).__name__})", type(m).__name__)
                           for name, m in module.named_modules()}
            st.root_type = type(module).__name__
            p = next(module.parameters(), None)
            self.device_type = p.device.type if p is not None else "cpu"
        if not self.modes and not st.recording:
            on = torch.is_autocast_enabled(self.device_type)
            if not (module is self.root and (on or self.autocast_seen or self._fp32_run())):
                self.autocast_seen = self.autocast_seen or on
                return
            st.phase = "forward"  # an unrecorded step's backward came before
            self.modes = [_AutocastState(st, self.device_type), _Recorder(st)]
            for mode in self.modes:
                mode.__enter__()
            st.recording = True
        st.stack.append(self._names.get(id(module), (f"({type(module).__name__})", type(module).__name__)))

    def _post(self, module, args, out) -> None:
        st = self.state
        if self.done or torch.compiler.is_compiling() or not st.stack:
            return
        st.stack.pop()
        if module is self.root and self.output_dtype is None:
            first = _first_tensor(out)
            self.output_dtype = _dtype_name(first.dtype) if first is not None else None

    def on_backward(self) -> None:
        self.state.phase = "backward"

    def _fp32_run(self) -> bool:
        return getattr(self.switch, "mode", "amp") == "fp32"

    def on_step(self, step: int) -> None:
        from ampkit.diagnose.stop import StopRun

        if self.modes:
            self.audited_step = step
            self._stop()
        if self.audited_step is not None:
            raise StopRun(f"stopped after the audited step {step}")
        if step >= SEARCH_STEPS:
            self.done = True
            raise StopRun(f"no autocast in the first {step} optimizer steps")

    def _pause(self) -> None:
        """At the optimizer step: the step's ops are recorded (on_step then stops the run)."""
        if self.modes:
            self.state.recording = False

    def _stop(self) -> None:
        if self.done:
            return
        self.done = True
        self.state.recording = False
        for mode in reversed(self.modes):
            mode.__exit__(None, None, None)
        self.modes = []

    def result(self, switch: "Switch") -> dict[str, Any] | None:
        """The audit's ``to_dict()``, as ``ampkit audit --json`` prints it; None when no module ever ran."""
        from ampkit.device import parse_device
        from ampkit.device.policy import Precision
        from ampkit.verify.audit import result_from_records

        if self.root is None:
            return None
        if self.audited_step is None and not self.state.records:
            return {"unrecorded": f"no optimizer step of its first {switch.step} enabled autocast in a forward"}
        seen = sorted(switch.autocast_seen)
        dtype = getattr(torch, seen[0].split(":")[1]) if seen else torch.float32
        name = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "fp32")
        dev = parse_device(self.device_type)
        prec = Precision(name=name, dtype=dtype, use_scaler=switch.scaler_enabled, tf32=False,
                         reason=f"autocast as the script runs it ({', '.join(seen) or 'none'})", device=dev)
        notes = [] if any(r.phase == "backward" for r in self.state.records) else ["no backward ops recorded"]
        return result_from_records(self.state.records, self.root, prec, self.output_dtype, notes).to_dict()


if __name__ == "__main__":
    from ampkit.diagnose.script_run import main

    sys.exit(main(recorder=FirstStepAudit()))
