"""FP8 (torchao float8 training) against BF16 through ampkit, compiled, on one GPU; writes JSON.

    PYTHONPATH=src python benchmarks/fp8_h200.py --out benchmarks/results/h200-2026-12-01-fp8.json

What runs: ampkit's ``CharLM`` (pre-LayerNorm GPT blocks, tied head) built on the device, in the shapes
``gpt-d2048-l24`` (d=2048, 24 layers, 16 heads, B8 x T2048, vocab 50304) and ``gpt2-small`` (d=768,
12 layers, B16 x T1024); each step is ampkit's: ``MixedPrecision(resolve_precision(p))``, ``autocast``,
``backward``, ``step`` with fused AdamW; FP8 configs first call ``ampkit.engine.fp8.convert(model, recipe=...)``.
Tokens are random (timing only). Compilation is regional: each transformer block is compiled
(``block.compile()``, one graph reused by all blocks) and so are the final norm + head + loss; the
embeddings run eager. Whole-model compilation of the big shape takes 1.5-2.5 min per config, more than
a short device lease holds; the regional graphs compile in well under a minute.

Configs run in rounds (bf16, fp8 tensorwise, fp8 rowwise, then again), so the spread between rounds is
reported; each config builds a fresh model, and peak memory is measured per config after the previous
one is freed. The JSON is rewritten after every config: a run cut short keeps what it measured.
``--budget-s`` stops starting new configs after that many seconds.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from ampkit.engine import fp8
from ampkit.device import detect_device
from ampkit.engine import MixedPrecision
from ampkit.device.policy import resolve_precision
from ampkit.tasks.charlm import CharLM

SHAPES = {
    "gpt-d2048-l24": dict(d_model=2048, n_layers=24, n_heads=16, seq_len=2048, batch_size=8, vocab_size=50304),
    "gpt2-small": dict(d_model=768, n_layers=12, n_heads=12, seq_len=1024, batch_size=16, vocab_size=50304),
    "tiny": dict(d_model=256, n_layers=2, n_heads=4, seq_len=64, batch_size=2, vocab_size=512),  # a CPU smoke run
}
CONFIGS = {"bf16": ("bf16", None), "fp8-tensorwise": ("fp8", "tensorwise"), "fp8-rowwise": ("fp8", "rowwise")}


def _tail(model: CharLM, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    logits = model.head(model.ln_f(x))
    return F.cross_entropy(logits.view(-1, logits.shape[-1]), y.reshape(-1))


_TAIL = torch.compile(_tail, dynamic=False)


def run_config(shape_name: str, config: str, *, device, warmup: int, chunks: int, chunk_steps: int) -> dict:
    shape = SHAPES[shape_name]
    precision, recipe = CONFIGS[config]
    torch.manual_seed(0)
    with torch.device(device.torch_device):
        model = CharLM(vocab_size=shape["vocab_size"], d_model=shape["d_model"], n_layers=shape["n_layers"],
                       n_heads=shape["n_heads"], max_len=shape["seq_len"])
    amp = MixedPrecision(resolve_precision(precision, device), max_grad_norm=1.0)
    report = fp8.convert(model, recipe=recipe) if recipe else None
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
    for block in model.blocks:
        block.compile(dynamic=False)
    b, t = shape["batch_size"], shape["seq_len"]
    gen = torch.Generator(device=device.torch_device).manual_seed(1)
    batches = [(torch.randint(0, 256, (b, t), device=device.torch_device, generator=gen),
                torch.randint(0, 256, (b, t), device=device.torch_device, generator=gen)) for _ in range(4)]
    pos = torch.arange(t, device=device.torch_device)

    def step(i: int) -> torch.Tensor:
        idx, y = batches[i % len(batches)]
        with amp.autocast():
            x = model.tok(idx) + model.pos(pos)
            for block in model.blocks:
                x = block(x)
            loss = _TAIL(model, x, y)
        amp.backward(loss)
        amp.step(opt)
        return loss.detach()

    t0 = time.perf_counter()
    for i in range(warmup):
        loss = step(i)
    device.synchronize()
    warmup_s = time.perf_counter() - t0
    device.reset_peak_memory_stats()
    per_chunk = []
    for c in range(chunks):
        device.synchronize()
        t1 = time.perf_counter()
        for i in range(chunk_steps):
            loss = step(warmup + c * chunk_steps + i)
        device.synchronize()
        per_chunk.append((time.perf_counter() - t1) * 1000 / chunk_steps)
    ms = statistics.median(per_chunk)
    result = {
        "shape": shape_name, "config": config, "precision": precision, "recipe": recipe,
        "ms_per_step": round(ms, 2), "ms_per_step_chunks": [round(x, 2) for x in per_chunk],
        "tokens_per_s": round(b * t / (ms / 1000)), "peak_memory_gib": _gib(device.max_memory_allocated()),
        "warmup_s_incl_compile": round(warmup_s, 1), "final_loss": round(float(loss), 4),
        "stats": {k: v for k, v in amp.stats().items() if isinstance(v, (int, float, bool, type(None)))},
        "fp8_report": report.to_dict() if report else None,
        "fp8_summary": report.summary() if report else None,
    }
    del model, opt, amp, batches
    gc.collect()
    device.empty_cache()
    return result


def _gib(n: int | None) -> float | None:
    return None if n is None else round(n / 2**30, 2)


def _git_commit() -> str | None:
    if os.environ.get("AMPKIT_COMMIT"):
        return os.environ["AMPKIT_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except Exception:  # noqa: BLE001 - a copy without .git: the caller passes AMPKIT_COMMIT
        return None


def _summarise(results: list[dict]) -> dict:
    out: dict = {}
    for shape in SHAPES:
        rows = [r for r in results if r["shape"] == shape]
        by = {c: [r for r in rows if r["config"] == c] for c in CONFIGS}
        if not by["bf16"]:
            continue
        base = statistics.median(r["ms_per_step"] for r in by["bf16"])
        entry = {"bf16_ms": base, "bf16_peak_gib": max((r["peak_memory_gib"] or 0) for r in by["bf16"])}
        for c in ("fp8-tensorwise", "fp8-rowwise"):
            if by[c]:
                ms = statistics.median(r["ms_per_step"] for r in by[c])
                entry[c] = {"ms": ms, "speedup_vs_bf16": round(base / ms, 3),
                            "speedups_per_round": [round(b["ms_per_step"] / r["ms_per_step"], 3)
                                                   for b, r in zip(by["bf16"], by[c])],
                            "peak_gib": max((r["peak_memory_gib"] or 0) for r in by[c])}
        out[shape] = entry
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", nargs="+", default=["gpt-d2048-l24", "gpt2-small"], choices=list(SHAPES))
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--chunks", type=int, default=3)
    ap.add_argument("--chunk-steps", type=int, default=5)
    ap.add_argument("--budget-s", type=float, default=240.0)
    args = ap.parse_args(argv)
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 16)
    device = detect_device()
    fp8.require_torchao()  # the quiet import; then its version
    import torchao

    doc = {
        "benchmark": "fp8 vs bf16 through ampkit, regional torch.compile",
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "card": device.name, "capability": list(device.capability) if device.capability else None,
        "versions": {"torch": torch.__version__, "torchao": torchao.__version__, **device.runtime_versions()},
        "git_commit": _git_commit(), "python": sys.version.split()[0],
        "shapes": {s: SHAPES[s] for s in args.shapes}, "method": {
            "rounds": args.rounds, "warmup_steps": args.warmup, "timed": f"{args.chunks} chunks x {args.chunk_steps} steps",
            "ms_per_step": "median of the chunks", "compile": "regional: each block + (ln_f, head, loss); embeddings eager",
            "optimizer": "fused AdamW, clip 1.0", "data": "random tokens"},
        "results": [], "skipped": [],
    }
    start = time.perf_counter()
    plan = [(r, s, c) for s in args.shapes for r in range(args.rounds) for c in args.configs]
    plan.sort(key=lambda x: (x[0] > 0, x[0], args.shapes.index(x[1])))  # first round of every shape first
    for rnd, shape, config in plan:
        if time.perf_counter() - start > args.budget_s:
            doc["skipped"].append({"round": rnd, "shape": shape, "config": config, "why": "time budget"})
            continue
        print(f"[{time.perf_counter() - start:6.1f}s] round {rnd} {shape} {config}", flush=True)
        try:
            res = run_config(shape, config, device=device, warmup=args.warmup, chunks=args.chunks,
                             chunk_steps=args.chunk_steps)
        except Exception as exc:  # noqa: BLE001 - record and go on: the other configs still count
            res = {"shape": shape, "config": config, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            gc.collect()
            device.empty_cache()
        res["round"] = rnd
        print(json.dumps(res)[:400], flush=True)
        doc["results"].append(res)
        doc["summary"] = _summarise([r for r in doc["results"] if "error" not in r])
        with open(args.out, "w") as fh:
            json.dump(doc, fh, indent=1)
    print(json.dumps(doc.get("summary"), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
