"""``ampkit parity``: does this device compute what the reference computes, within what mixed precision permits?

:func:`parity_script` runs a script's first steps and replays every op on a reference device in FP64
(:mod:`ampkit.parity.recorder`), judging each result against a bound that follows from the op and its dtype
(:mod:`ampkit.parity.bounds`).
"""

from ampkit.parity.run import ParityResult, parity_script

__all__ = ["ParityResult", "parity_script"]
