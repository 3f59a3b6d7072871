"""Names the CLI needs before torch is imported (``ampkit migrate --help`` should not load torch)."""

PRECISION_CHOICES = ("auto", "bf16", "fp16", "fp32")
BENCH_PRECISIONS = ("auto", "fp32", "tf32", "bf16", "fp16")
BENCH_PEERS = ("accelerate", "fabric")
BENCH_RUNNERS = ("plain", "ampkit", "ampkit-graph", "lesson", *BENCH_PEERS)
