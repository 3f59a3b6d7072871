# Modelled on state-spaces/mamba benchmarks/benchmark_generation_mamba_simple.py (Apache-2.0): a fixed
# device string, FP16 weights for generation, timing with torch.cuda.synchronize and peak memory.
# Written for ampkit's judge corpus.
import argparse
import time

import torch

parser = argparse.ArgumentParser(description="Generation benchmarking")
parser.add_argument("--promptlen", type=int, default=100)
parser.add_argument("--repeats", type=int, default=3)
args = parser.parse_args()

repeats = args.repeats
device = "cuda"
dtype = torch.float16


def benchmark(model):
    print(f"Loading model on {device}")
    model = model.to(device=device, dtype=dtype)
    input_ids = torch.randint(1, 1000, (1, args.promptlen), dtype=torch.long, device="cuda")
    torch.cuda.synchronize()
    start = time.time()
    for _ in range(repeats):
        model(input_ids)
    torch.cuda.synchronize()
    print(f"Prompt processing + decoding time: {(time.time() - start) / repeats * 1000:.0f}ms")
    print(f"Peak memory: {torch.cuda.max_memory_allocated() / 1e9:.2f} GB")
