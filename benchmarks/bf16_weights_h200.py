"""On a GPU: peak memory and step time of the ways to store the weights of a BF16 run, on Hugging Face's
LlamaForCausalLM (random weights, no download) at the TinyLlama-1.1B shape and a 2.2B shape, eager, fused AdamW:

* ``hand``: a hand-written loop, FP32 weights under BF16 autocast (torch's documented pattern);
* ``fp32-weights``: ampkit's engine, the same thing;
* ``bf16-weights``: ampkit's ``weights="bf16"`` (BF16 weights + 16-bit remainders, exact FP32 updates);
* ``bf16-pure``: ``weights="bf16-pure"`` (pure BF16 weights, no master copy).

    python benchmarks/bf16_weights_h200.py --out results.json [--shapes 1.1b 2.2b] [--steps 10]

Each mode starts from the same initial weights (the same seed) and batches; the first losses of ``hand`` and
``fp32-weights`` are recorded to show they match. Also checks that split/join are exact on the device.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
from pathlib import Path

import torch

SHAPES = {
    "1.1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                 num_key_value_heads=4, vocab_size=32000),
    "2.2b": dict(hidden_size=2560, intermediate_size=6912, num_hidden_layers=30, num_attention_heads=32,
                 num_key_value_heads=8, vocab_size=32000),
}


def _model(shape: str):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**SHAPES[shape], max_position_embeddings=2048)
    torch.manual_seed(0)
    with torch.device("cuda"):
        return LlamaForCausalLM(cfg)


def run_mode(shape: str, mode: str, steps: int, batch: int, seq: int) -> dict:
    import ampkit

    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    model = _model(shape)
    n = sum(p.numel() for p in model.parameters())
    amp = None
    if mode != "hand":
        weights = {"fp32-weights": "fp32", "bf16-weights": "bf16", "bf16-pure": "bf16-pure"}[mode]
        amp = ampkit.MixedPrecision("bf16", weights=weights, device="cuda")
        amp.attach(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    g = torch.Generator(device="cuda").manual_seed(1)
    data = [torch.randint(0, 32000, (batch, seq), device="cuda", generator=g) for _ in range(3 + steps)]
    losses, times = [], []
    for i, idx in enumerate(data):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        if amp is None:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(idx, labels=idx).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        else:
            with amp.autocast():
                loss = model(idx, labels=idx).loss
            amp.backward(loss)
            amp.step(opt)
        end.record()
        losses.append(loss.detach())
        times.append((start, end))
    torch.cuda.synchronize()
    ms = [s.elapsed_time(e) for s, e in times[3:]]
    out = {"mode": mode, "shape": shape, "parameters": n, "batch": [batch, seq],
           "step_ms_median": statistics.median(ms), "step_ms_min": min(ms), "step_ms_max": max(ms),
           "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
           "held_after_step_gib": torch.cuda.memory_allocated() / 2**30,
           "losses": [float(x) for x in losses[:5]],
           "weight_dtype": str(next(model.parameters()).dtype)}
    del model, opt, amp, data, losses
    torch.cuda.empty_cache()
    return out


def exact_on_device() -> bool:
    from ampkit.engine.master import join, split

    bits = torch.randint(-2**31, 2**31 - 1, (10_000_000,), dtype=torch.int32, device="cuda")
    high, rem = split(bits.view(torch.float32))
    return bool(torch.equal(join(high, rem).view(torch.int32), bits))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", nargs="+", default=["1.1b", "2.2b"])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    args = ap.parse_args()
    import transformers

    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip() or None
    data = {"kind": "bf16-weights-gpu", "date": datetime.date.today().isoformat(), "git_commit": commit,
            "card": torch.cuda.get_device_name(), "torch": torch.__version__, "transformers": transformers.__version__,
            "split_join_exact_on_device": exact_on_device(), "runs": []}
    for shape in args.shapes:
        for mode in ("hand", "fp32-weights", "bf16-weights", "bf16-pure"):
            try:
                data["runs"].append(run_mode(shape, mode, args.steps, args.batch, args.seq))
            except Exception as exc:  # noqa: BLE001 - record and go on (e.g. out of memory)
                data["runs"].append({"mode": mode, "shape": shape, "error": f"{type(exc).__name__}: {exc}"[:300]})
            print(json.dumps(data["runs"][-1]), flush=True)
            Path(args.out).write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main()
