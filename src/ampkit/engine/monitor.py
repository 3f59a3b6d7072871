"""The FP16 scale monitor: warns ``scale-collapse`` when the loss scale keeps falling or hits its floor."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

__all__ = ["ScaleMonitor", "ScaleWarning"]


@dataclass(frozen=True)
class ScaleWarning:
    code: str
    step: int
    message: str
    fix: str


class ScaleMonitor:
    """Feed it ``(step, scale, skipped_total)`` at every metrics read.

    A backoff is a skipped FP16 step (the scaler halves the scale on every overflow). More than
    ``max_backoffs`` backoffs within the last ``window`` optimizer steps, or a scale at or below
    ``floor``, gives one ``scale-collapse`` warning (once per run).
    """

    def __init__(self, *, window: int = 100, max_backoffs: int = 10, floor: float = 1.0,
                 advice: str = "lower the learning rate") -> None:
        self.window = window
        self.max_backoffs = max_backoffs
        self.floor = floor
        self.advice = advice  # the first fix to try: ampkit.device.policy.bf16_advice(device)
        self._events: deque[tuple[int, int]] = deque()
        self._last_skipped = 0
        self.warning: ScaleWarning | None = None

    def update(self, step: int, scale: float, skipped_total: int) -> ScaleWarning | None:
        new = skipped_total - self._last_skipped
        self._last_skipped = skipped_total
        if new > 0:
            self._events.append((step, new))
        while self._events and self._events[0][0] <= step - self.window:
            self._events.popleft()
        if self.warning is not None:
            return None
        backoffs = sum(n for _, n in self._events)
        reason = None
        if scale <= self.floor:
            reason = f"the FP16 loss scale fell to {scale:g} (floor {self.floor:g}) by step {step}"
        elif backoffs > self.max_backoffs:
            reason = (f"the FP16 loss scale backed off {backoffs} times in the last {self.window} steps "
                      f"(now {scale:g}, step {step})")
        if reason is None:
            return None
        fix = (self.advice + "; or keep the overflowing module in FP32 with --fp32-modules NAME (find it with "
               "`ampkit diagnose --fp16-range SCRIPT`)")
        self.warning = ScaleWarning("scale-collapse", step, reason + ": gradients keep overflowing FP16", fix)
        return self.warning
