"""Where a run's numbers go: the loss window kept on the device, one record per logged step, and the
sinks (``metrics.jsonl``, TensorBoard, the FP16 scale monitor, the progress callback).

Every logged step costs one host read (:meth:`MixedPrecision.stats` and the loss window), plus one
all_reduce of a few numbers on several ranks; the steps in between read nothing.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import torch

from ampkit.checkpoint import atomic_write_bytes
from ampkit.errors import UsageError
from ampkit.engine.monitor import ScaleMonitor

__all__ = ["LossWindow", "MetricsSink", "truncate_metrics"]

Progress = Callable[[dict[str, Any]], None]
Reduce = Callable[[list[float]], list[float]]


class LossWindow:
    """Sum and count of the finite losses since the last log, kept on the device (no read per step)."""

    def __init__(self, device: torch.device) -> None:
        self.sums = torch.zeros(2, dtype=torch.float32, device=device)
        self.count = 0  # micro-batches seen, finite or not
        self.t0 = time.perf_counter()

    def add(self, loss: torch.Tensor) -> None:
        lv = loss.detach().float()
        finite = torch.isfinite(lv)
        self.sums[0] += torch.where(finite, lv, torch.zeros_like(lv))
        self.sums[1] += finite.float()
        self.count += 1

    def reset(self) -> None:
        self.sums.zero_()
        self.count = 0
        self.t0 = time.perf_counter()


def log_record(amp: Any, window: LossWindow, step: int, samples_per_step: int, peak_mem: int | None,
               reduce: Reduce | None = None) -> dict[str, Any]:
    """The metrics record of ``step``: the host reads of this log step."""
    stats = amp.stats()
    total, n_finite = window.sums.tolist()
    count = window.count
    steps_in_window = max(count // max(amp.accumulation_steps, 1), 1)
    skipped, extra = stats["skipped"], {}
    if reduce is not None:
        # One all_reduce per log step: the loss is the mean over every rank's share of the global batch
        # (equal shares: the single-process loss); skip counts agree, and the sum checks that they do.
        total, n_finite, count_all, skipped_sum, world_f = reduce([total, n_finite, float(count),
                                                                   float(stats["skipped"]), 1.0])
        world = round(world_f)
        count = round(count_all)
        extra = {"ranks": world}
        if round(skipped_sum) != stats["skipped"] * world:
            extra["skip_disagreement"] = True
    loss = total / n_finite if n_finite else float("nan")
    dt = time.perf_counter() - window.t0
    norm = stats["grad_norm"]
    return {
        "step": step,
        "loss": loss if math.isfinite(loss) else None,
        "nonfinite_losses": count - int(n_finite),
        "scale": stats["scale"],
        "skipped": skipped,
        "consecutive_skips": stats["consecutive_skips"],
        "grad_norm": norm if norm is not None and math.isfinite(norm) else None,
        "samples_per_s": (samples_per_step * steps_in_window / dt) if dt > 0 else None,
        "peak_mem_bytes": peak_mem,
        "time": time.time(),
        **extra,
    }


class MetricsSink:
    """Takes each record (rank 0 writes; other ranks keep history only) and passes it on.

    ``metrics.jsonl``: one JSON object per logged step, appended when resuming (after the steps past
    the checkpoint were dropped: :func:`truncate_metrics`), flushed per record.
    """

    _TB_KEYS = ("loss", "scale", "grad_norm", "samples_per_s", "skipped")

    def __init__(self, out: Path | None, *, write: bool, resumed_at: int, tensorboard: bool,
                 monitor: ScaleMonitor | None, progress: Progress | None) -> None:
        self.history: list[dict[str, Any]] = []
        self.warnings: list[dict[str, Any]] = []
        self.emit = progress or (lambda record: None)
        self.monitor = monitor
        self._jsonl = self._tb = None
        if write and out is not None:
            out.mkdir(parents=True, exist_ok=True)
            if resumed_at > 0:  # a run killed after its last checkpoint logged steps it will now train again
                truncate_metrics(out / "metrics.jsonl", resumed_at)
            self._jsonl = open(out / "metrics.jsonl", "a" if resumed_at > 0 else "w", encoding="utf-8")
        if write and tensorboard:
            self._tb = _tensorboard(out)

    def add(self, record: dict[str, Any]) -> None:
        self.history.append(record)
        if self._jsonl is not None:
            self._jsonl.write(json.dumps(record) + "\n")
            self._jsonl.flush()
        if self._tb is not None:
            for key in self._TB_KEYS:
                if record.get(key) is not None:
                    self._tb.add_scalar(key, record[key], record["step"])
        if self.monitor is not None:
            warn = self.monitor.update(record["step"], record["scale"], record["skipped"])
            if warn is not None:
                self.warnings.append(asdict(warn))
                self.emit({"event": "warning", **asdict(warn)})
        self.emit({"event": "log", **record})

    def mean_samples_per_s(self) -> float | None:
        """Throughput over the logged windows, leaving out the first (warm-up) where there are more."""
        sps = [r["samples_per_s"] for r in self.history if r.get("samples_per_s")]
        if len(sps) > 1:
            return sum(sps[1:]) / len(sps[1:])
        return sps[0] if sps else None

    def close(self) -> None:
        for sink in (self._jsonl, self._tb):
            if sink is not None:
                sink.close()


def _tensorboard(out: Path | None) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise UsageError("--tensorboard needs the tensorboard package: pip install 'ampkit[tensorboard]'") from exc
    return SummaryWriter(log_dir=str((out or Path("runs")) / "tensorboard"))


def truncate_metrics(path: Path, step: int) -> int:
    """Keep the records of ``path`` up to ``step`` (a restart resumes there: no step is logged twice).

    Returns how many lines were dropped (records past ``step`` and a torn last line).
    """
    if not path.is_file():
        return 0
    kept, dropped = [], 0
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            ok = int(json.loads(line)["step"]) <= step
        except (ValueError, KeyError, TypeError):
            ok = False
        if ok:
            kept.append(line)
        else:
            dropped += 1
    if dropped:
        data = "".join(line + "\n" for line in kept).encode()
        atomic_write_bytes(path, lambda fh: fh.write(data))
    return dropped
