"""A device with one wrong kernel, simulated on the CPU: ``python faulty_device.py FAULT SCRIPT ARGS``.

Since no MUSA card (or any second device) is reachable here, the "device" is the CPU with one aten kernel
replaced for the dtypes the script computes in (FP32, BF16, FP16); FP64, the reference's dtype, keeps a correct
kernel. The replacement is removed when the script ends.
FAULT: ``softmax-off-by-one`` (the result shifted by one position along its dim) or ``sum-drops-last`` (a
reduction that leaves out the last element).
"""
import runpy
import sys

import torch

FAULT, SCRIPT = sys.argv[1], sys.argv[2]


def softmax(x, dim, half_to_float):
    y = torch.exp(x.double() - x.double().amax(dim, keepdim=True))
    y = y / y.cumsum(dim).narrow(dim, y.shape[dim] - 1, 1)
    if x.dtype != torch.float64:
        y = torch.roll(y, 1, dim)  # the planted defect: off by one position
    return y.to(torch.float32 if half_to_float else x.dtype)


def sum_dim(x, dims, keepdim=False, dtype=None):
    (dim,) = dims
    n = x.shape[dim] - (1 if x.dtype != torch.float64 else 0)  # the planted defect: the last element left out
    out = x.narrow(dim, 0, n).double().cumsum(dim).narrow(dim, n - 1, 1)
    out = out if keepdim else out.squeeze(dim)
    return out.to(dtype or x.dtype)


lib = torch.library.Library("aten", "IMPL")
if FAULT == "softmax-off-by-one":
    lib.impl("_softmax", softmax, "CPU")
elif FAULT == "sum-drops-last":
    lib.impl("sum.dim_IntList", sum_dim, "CPU")
sys.argv = [SCRIPT, *sys.argv[3:]]
try:
    runpy.run_path(SCRIPT, run_name="__main__")
finally:
    lib._destroy()
