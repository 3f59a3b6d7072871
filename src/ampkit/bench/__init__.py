"""``ampkit bench``: step time, throughput, MFU, peak memory and host syncs of the AMP engine against a
hand-written torch loop, the lesson's loop and peer libraries, on the present device.

>>> from ampkit.bench import BenchConfig, run_bench
>>> result = run_bench(BenchConfig(model="lesson", precisions=("fp32",), steps=3))   # doctest: +SKIP
>>> [(r["runner"], round(r["ms_per_step"], 3)) for r in result["rows"]]               # doctest: +SKIP

The result is a plain dict (the JSON of ``ampkit bench --json``); its ``bars`` judge the figures
against the project's targets and its ``notes`` say what a reader should know.
"""

from ampkit.bench.core import BENCH_PRECISIONS, BenchConfig, run_bench
from ampkit.bench.runners import RUNNERS
from ampkit.bench.workloads import GPT2_SMALL, MODEL_NAMES, SimpleModel, Workload, load_workload

__all__ = ["BenchConfig", "run_bench", "BENCH_PRECISIONS", "RUNNERS", "MODEL_NAMES", "GPT2_SMALL", "SimpleModel",
           "Workload", "load_workload"]
