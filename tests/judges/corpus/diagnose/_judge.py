"""What a plain run of a corpus script observed, for the judges harness (benchmarks/judges.py, tests/judges/).

Every script in this folder ends by calling :func:`report` with its last loss and whether the defect it
plants (or, in a clean script, the same measurement) was observed. The harness runs each script plainly
(``python NAME.py``) to prove the truth table: a planted script must show its defect, a clean one must train
to a finite loss without it. ``ampkit diagnose`` never reads this line.
"""
import json
import math

import torch


def report(loss, defect):
    """Print one line ``JUDGE {"finite": ..., "defect": ...}`` on stdout."""
    value = float(loss.detach().float()) if torch.is_tensor(loss) else float(loss)
    print("JUDGE " + json.dumps({"finite": math.isfinite(value), "defect": bool(defect), "loss": value}))


def zero_share(grad):
    """The share of exactly-zero entries of a gradient (FP16 underflow shows as zeros)."""
    return 0.0 if grad is None else (grad == 0).float().mean().item()


def params_finite(model):
    return all(torch.isfinite(p).all().item() for p in model.parameters())


def snapshot(model):
    return [p.detach().clone() for p in model.parameters()]


def change(model, before):
    """The largest absolute change of any parameter since ``before``."""
    return max((p.detach().float() - b.float()).abs().max().item() for p, b in zip(model.parameters(), before))
