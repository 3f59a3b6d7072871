"""Names the CLI needs before torch is imported (``ampkit migrate --help`` should not load torch)."""

PRECISION_CHOICES = ("auto", "bf16", "fp16", "fp32", "fp8")
# Other spellings people use, in any case: the CLI and the Python API accept the same ones.
PRECISION_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32",
                     "float8": "fp8"}


def precision_name(value: str) -> str:
    """``"BF16"``, ``" bfloat16 "`` -> ``"bf16"``; an unknown name is returned lower-cased, for the caller to refuse."""
    name = str(value).strip().lower()
    return PRECISION_ALIASES.get(name, name)
FP8_RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")  # torchao's Float8LinearRecipeName; first: default
# Which layers --precision fp8 converts: those the cost model predicts faster ("paying"), or every one the shape
# filter allows ("eligible": for FP8's numerics or memory, speed not checked).
FP8_LAYERS = ("paying", "eligible")
BENCH_PRECISIONS = ("auto", "fp32", "tf32", "bf16", "fp16", "fp8")
BENCH_PEERS = ("accelerate", "fabric")
BENCH_RUNNERS = ("plain", "ampkit", "ampkit-graph", "lesson", *BENCH_PEERS)
# How a BF16 run stores its weights (ampkit.engine.master): FP32 (autocast casts per op), BF16 with exact FP32
# updates (16-bit remainders), pure BF16 (no master copy; to measure its harm). First: the default.
WEIGHTS = ("fp32", "bf16", "bf16-pure")
