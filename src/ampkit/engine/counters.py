"""The engine's on-device counters: one small tensor, updated without host reads, read in one transfer.

Layout of the one allocation (float32):
  0 skipped, 1 consecutive skips, 2 max consecutive since the last read, 3 last grad norm,
  4 last skipped, 5 the constant 1.0 (so the update needs no other tensor),
  6 the FP16 loss scale, 7 the scaler's growth tracker (int32 bits).
float32 counts exactly up to 2**24 skipped steps.
"""

from __future__ import annotations

import torch

from ampkit import compat
from ampkit.errors import TrainingHalted

__all__ = ["DeviceCounters", "check_skip_limit"]


def check_skip_limit(max_consec: float, limit: int | None, *, step: int, scale: float | None, scaler: bool,
                     streak: float | None = None) -> None:
    """Raise :class:`~ampkit.errors.TrainingHalted` when ``max_consec`` skipped steps in a row reach ``limit``.
    ``streak``: the skips in a row up to ``step`` when read with it (the error's ``first_bad_step`` then
    names where the streak began)."""
    if limit is None or max_consec < limit:
        return
    at = f" (scale {scale:g})" if scale is not None else ""
    first = step - int(streak) + 1 if streak is not None and streak >= limit else None
    raise TrainingHalted(
        f"{int(max_consec)} optimizer steps in a row had non-finite gradients{at}: training stopped at "
        f"step {step}. Find the cause with `ampkit diagnose SCRIPT` "
        + ("(and try --precision bf16 where the card has it, or a lower learning rate)"
           if scaler else "(and try a lower learning rate or --precision fp32)"), step=step, first_bad_step=first)


class DeviceCounters:
    """Skip counters, last norm and last skip flag in one device tensor (plus the scaler's state)."""

    def __init__(self, device: torch.device, scaler: torch.amp.GradScaler | None) -> None:
        self.state = torch.zeros(8, dtype=torch.float32, device=device)
        self.state[5] = 1.0
        self._views = self.state[:6].unbind()  # made once: no per-step indexing
        if scaler is not None and compat.scaler_tensors(scaler)[0] is None:
            # GradScaler makes its scale and growth tracker lazily, as two more one-element tensors (two
            # more allocator blocks). Handing it views of this block keeps FP16 training from allocating
            # anything a hand-written loop would not.
            init_scale, init_tracker = compat.scaler_init_values(scaler)
            self.state[6] = init_scale
            tracker = self.state[7:8].view(torch.int32)
            tracker.fill_(init_tracker)
            compat.adopt_scaler_tensors(scaler, self.state[6], tracker[0])

    def count(self, found: torch.Tensor, norm: torch.Tensor) -> None:
        """Record one step: ``found`` 1.0 when it was skipped; ``norm`` the gradient norm."""
        skipped, consec, max_consec, last_norm, last, one = self._views
        compat.foreach_add_([skipped, consec], [found, one])
        consec.mul_(found)
        torch.maximum(max_consec, consec, out=max_consec)
        compat.foreach_copy_([last_norm, last], [norm.detach().float(), found])

    @property
    def last_skipped(self) -> torch.Tensor:
        return self._views[4]

    def read(self, scale: torch.Tensor | None) -> list[float]:
        """[skipped, consecutive, max consecutive since the last read, norm, last skipped(, scale)] in one
        transfer; starts a new max-consecutive window."""
        parts = [self.state[:5].to(torch.float64)]
        if scale is not None:
            parts.append(scale.to(self.state.device, torch.float64).reshape(1))
        values = torch.cat(parts).tolist()  # the one device -> host transfer
        self.state[2].copy_(self.state[1])
        return values

    def read_max_consecutive(self) -> float:
        """The longest run of skips since the last read (one host read); starts a new window."""
        value = float(self.state[2])
        self.state[2].copy_(self.state[1])
        return value

    def to_saved(self) -> torch.Tensor:
        """[skipped, consecutive, max_consecutive] as int64 on the CPU (the format since ampkit 0.1)."""
        return self.state[:3].detach().to("cpu", torch.int64)

    def load_saved(self, counters: torch.Tensor) -> None:
        self.state[:3].copy_(counters.to(self.state.device, torch.float32))
