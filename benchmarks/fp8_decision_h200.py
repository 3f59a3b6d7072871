"""Issue 42's GPU figures: the measured FP8 decision on models nobody here wrote, compiled, with its own cost.

    OUT=/tmp/out python benchmarks/fp8_decision_h200.py hf-llama vit llama-1b   # models, in order
    OUT=/tmp/out python benchmarks/fp8_decision_h200.py --tiny hf-llama vit     # the same code, CPU-sized

For each model: the FP8 decision exactly as ``ampkit bench``/``train`` make it
(:func:`ampkit.engine.fp8_choice.measured_decision`: the candidates, the interleaved rounds, the rule), timed
from the first candidate's build to the verdict (``decision_s``: the compiles are in it), then a confirmation on the
same compiled steps: ``CONFIRM_ROUNDS`` more interleaved rounds of BF16, FP8 on every eligible layer and the
decision's pick. The result says whether the decision is within 3 % of the faster of BF16 and FP8-eligible and
not slower than BF16 (beyond the confirmation's spread). One JSON per model:
``$OUT/fp8-decision-<model>.json``; a model is skipped when less than ``MIN_LEFT_S`` of ``BUDGET_S`` is left.

Models (random weights, random tokens or images, no downloads):
* ``hf-llama``: transformers ``LlamaForCausalLM`` at the TinyLlama-1.1B shape (d 2048, 22 layers, GQA 32/4, ffn
  5632, vocab 32000), 4 x 2048 tokens, fused AdamW;
* ``hf-llama-big``: the same at d 3072, 16 layers, GQA 24/8, ffn 8192 (1.9B), 2 x 2048 tokens;
* ``vit``: timm ``vit_base_patch16_224``, 128 images, fused AdamW;
* ``llama-1b``: ampkit's own ``llama-1b`` bench workload (the built-in Llama) at 4 x 2048 tokens.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ampkit.bench.workloads import Workload, load_workload
from ampkit.device import detect_device
from ampkit.device.policy import resolve_precision
from ampkit.device.provenance import git_commit
from ampkit.engine.fp8_choice import TrialSetup, measured_decision
from ampkit.engine.fp8_probe import cost_model
from ampkit.engine.fp8_trial import BF16, ELIGIBLE, MIN_GAIN
from ampkit.engine.fp8_trial_steps import StepTrial

CONFIRM_ROUNDS = 5
BUDGET_S = float(os.environ.get("BUDGET_S", "560"))
MIN_LEFT_S = {"hf-llama": 200, "hf-llama-big": 240, "vit": 90, "llama-1b": 200}


def _llama_hf(tiny: bool, big: bool) -> dict[str, Any]:
    import transformers

    if tiny:
        shape = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=3, num_attention_heads=4,
                     num_key_value_heads=2, vocab_size=512)
        b, t = 2, 32
    elif big:
        shape = dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=24,
                     num_key_value_heads=8, vocab_size=32000)
        b, t = 2, 2048
    else:
        shape = dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                     num_key_value_heads=4, vocab_size=32000)
        b, t = 4, 2048
    cfg = transformers.LlamaConfig(max_position_embeddings=max(t, 64), tie_word_embeddings=False, **shape)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randint(0, cfg.vocab_size, (b, t), generator=g),) for _ in range(4)]

    def loss(m: Any, batch: Any) -> torch.Tensor:
        return m(input_ids=batch[0], labels=batch[0]).loss

    n = sum(p.numel() for p in model.parameters())
    return dict(model=model, loss=loss, batches=batches, flops_per_step=6.0 * n * b * t, tokens_per_step=b * t,
                samples_per_step=b, lr=3e-4, weight_decay=0.1,
                description=f"transformers LlamaForCausalLM ({n / 1e9:.2f}B, {shape}), {b} x {t} tokens")


def _vit(tiny: bool) -> dict[str, Any]:
    import timm

    if tiny:
        model = timm.create_model("vit_tiny_patch16_224", num_classes=16, img_size=32, patch_size=8, depth=3,
                                  embed_dim=256, num_heads=4)
        b, s, classes = 4, 32, 16
    else:
        model = timm.create_model("vit_base_patch16_224", num_classes=1000)
        b, s, classes = 128, 224, 1000
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(b, 3, s, s, generator=g), torch.randint(0, classes, (b,), generator=g)) for _ in range(4)]

    def loss(m: Any, batch: Any) -> torch.Tensor:
        return F.cross_entropy(m(batch[0]), batch[1])

    n = sum(p.numel() for p in model.parameters())
    return dict(model=model, loss=loss, batches=batches, flops_per_step=None, tokens_per_step=None,
                samples_per_step=b, lr=1e-3, weight_decay=0.05,
                description=f"timm {model.default_cfg.get('architecture', 'vit')} ({n / 1e6:.0f}M), {b} images {s}x{s}")


def workload(name: str, device: Any, tiny: bool) -> Workload:
    if name == "llama-1b":
        opts = ({"d_model": 256, "n_layers": 3, "n_heads": 4, "n_kv_heads": 2, "ffn": 512, "vocab_size": 512,
                 "seq_len": 32, "batch_size": 2} if tiny else {"batch_size": 4})
        return load_workload("llama-1b", device, options=opts)
    parts = _vit(tiny) if name == "vit" else _llama_hf(tiny, big=name == "hf-llama-big")
    wl = Workload(name=name, **parts)
    wl.model.to(device.torch_device).train()
    wl.n_params = sum(p.numel() for p in wl.model.parameters())
    wl.batches = [tuple(t.to(device.torch_device) for t in b) for b in wl.batches]
    return wl


def record(name: str, device: Any, prec: Any, cost: Any, tiny: bool, log: Any) -> dict[str, Any]:
    wl = workload(name, device, tiny)
    fused = {"fused": True} if device.supports_fused_optimizer() else {}
    compile_kwargs = {"backend": "inductor"} if device.is_accelerator else {"backend": "eager"}
    steps = StepTrial(model=wl.model, loss=wl.loss, batches=wl.batches, precision=prec, device=device,
                      recipe="tensorwise", make_optimizer=lambda m: wl.optimizer(m.parameters(), **fused),
                      compile_kwargs=compile_kwargs, steps=2 if tiny else 5, warmup=1 if tiny else 3)
    timers: dict[str, Any] = {}

    def measure(c: Any) -> Any:
        timers[c.name] = steps(c)
        return timers[c.name]

    events: list[dict[str, Any]] = []

    def progress(ev: dict[str, Any]) -> None:
        events.append({k: v for k, v in ev.items() if k != "result"})
        log(json.dumps(events[-1])[:300])

    setup = TrialSetup(measure=measure, batch=wl.batches[0], card=device.name, capability=device.capability,
                       progress=progress, use_cache=False)
    tokens = wl.tokens_per_step or wl.samples_per_step
    t0 = time.perf_counter()
    result = measured_decision(wl.model, setup, recipe="tensorwise", mode="compiled", cost=cost, tokens=tokens)
    decision_s = time.perf_counter() - t0
    names = list(dict.fromkeys([BF16, ELIGIBLE, result.winner]))
    ms: dict[str, list[float]] = {n: [] for n in names if n in timers}
    for rnd in range(CONFIRM_ROUNDS):
        for n in (list(ms) if rnd % 2 == 0 else list(ms)[::-1]):
            ms[n].append(float(timers[n]()))
    peak = device.max_memory_allocated() if device.is_accelerator else None
    steps.release()
    med = {n: statistics.median(v) for n, v in ms.items()}
    spread = {n: max(v) - min(v) for n, v in ms.items()}
    best_ref = min(med.get(BF16, float("inf")), med.get(ELIGIBLE, float("inf")))
    decision_ms = med[result.winner]
    out = {
        "kind": "fp8-decision", "model": name, "description": wl.description, "n_params": wl.n_params, "tokens_per_step": wl.tokens_per_step,
        "samples_per_step": wl.samples_per_step, "mode": "compiled", "recipe": "tensorwise",
        "decision": result.to_dict(), "decision_s": round(decision_s, 1),
        "confirm": {"rounds": CONFIRM_ROUNDS, "steps_per_round": steps.steps, "ms_rounds": ms, "ms_median": med,
                    "ms_spread": spread},
        "decision_ms": decision_ms, "bf16_ms": med.get(BF16), "eligible_ms": med.get(ELIGIBLE),
        "best_of_bf16_eligible_ms": best_ref, "decision_over_best": decision_ms / best_ref,
        "within_3pct_of_best": decision_ms <= best_ref * (1 + MIN_GAIN),
        "not_slower_than_bf16": decision_ms <= med[BF16] + max(spread[BF16], spread[result.winner]),
        "peak_mem_bytes_all_candidates": peak, "events": events,
    }
    del wl
    device.empty_cache()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", choices=sorted(MIN_LEFT_S))
    ap.add_argument("--tiny", action="store_true", help="CPU-sized models (checks the script, measures nothing)")
    args = ap.parse_args()
    out = Path(os.environ.get("OUT", "/tmp/out"))
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    device = detect_device(None)
    prec = resolve_precision("fp8", device) if device.is_accelerator else dataclasses.replace(
        resolve_precision("bf16", device), name="fp8", reason="--tiny on the CPU")

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - start:6.1f}s] {msg}", flush=True)

    cost, how = (cost_model(device, "tensorwise", "compiled") if device.is_accelerator else (None, "CPU: none"))
    log(f"cost model: {how}")
    probe_s = time.perf_counter() - start
    versions = {"torch": torch.__version__}
    for pkg in ("torchao", "transformers", "timm"):
        try:
            from importlib.metadata import version

            versions[pkg] = version(pkg)
        except Exception:  # noqa: BLE001
            versions[pkg] = None
    for name in args.models:
        left = BUDGET_S - (time.perf_counter() - start)
        if left < MIN_LEFT_S[name] and not args.tiny:
            log(f"{name}: skipped, {left:.0f} s left")
            continue
        log(f"{name}: start")
        try:
            r = record(name, device, prec, cost, args.tiny, log)
        except Exception as exc:  # noqa: BLE001 - one model failing must not lose the others
            log(f"{name}: FAILED {type(exc).__name__}: {str(exc)[:400]}")
            continue
        r.update(date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), device=device.name,
                 capability=device.capability, versions=versions, git_commit=git_commit(),
                 cost_model={"how": how, "probe_or_load_s": round(probe_s, 1),
                             "source": cost.source() if cost else None})
        (out / f"fp8-decision-{name}.json").write_text(json.dumps(r, indent=1, default=str) + "\n")
        log(f"{name}: decision {r['decision']['winner']} {r['decision_ms']:.2f} ms, bf16 {r['bf16_ms']} ms, "
            f"eligible {r['eligible_ms']} ms, decision/best {r['decision_over_best']:.3f}, "
            f"decision cost {r['decision_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
