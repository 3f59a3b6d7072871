"""What this machine's CPU runs, checked with torch directly (not through ampkit), for expectations that
depend on it: oneDNN has BF16 (and FP16) LSTM kernels only with AVX-512, so on an AVX2-only CPU a BF16 LSTM
under autocast raises, and diagnose rightly reports it."""

from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=None)
def lstm_runs_in(dtype: torch.dtype) -> bool:
    try:
        with torch.autocast("cpu", dtype=dtype):
            torch.nn.LSTM(4, 4)(torch.zeros(2, 1, 4))
    except RuntimeError:
        return False
    return True
