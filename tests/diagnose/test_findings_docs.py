"""docs/reference/findings.md documents every registry code: what it means, an example, the fix. The
title, why and fix come from the registry (ampkit.findings) verbatim, so the text lives in one place;
`UPDATE_GOLDEN=1` rewrites the page from the registry and the examples kept in EXAMPLES below."""

from __future__ import annotations

import os
from pathlib import Path

from ampkit.findings import codes, info

PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "findings.md"

EXAMPLES = {
    "nonfinite-forward": """1. nonfinite-forward — a forward output became inf/NaN · step 0
   where: model.attn · attn_mask_fp16.py:29
   why:   the output of model.attn (CausalSelfAttention) became inf/NaN under cpu autocast to float16 at `aten.mul` (float16) on inputs with max |x| 1: overflow: the constant -1e+09 does not fit float16 (largest finite value 65504): it becomes -inf (the module was called at attn_mask_fp16.py:44)
   fix:   use a constant the low-precision dtype holds (`torch.finfo(scores.dtype).min` for a mask, or build the mask and add it in FP32); keep `attn` in FP32: `ampkit train --fp32-modules attn` ...""",
    "overflow-absorbed": """1. overflow-absorbed — an op overflowed inside a module whose output stayed finite · step 0
   where: model.head · softmax_sum_overflow.py:15
   why:   an op inside model.head (CosineHead) under cpu autocast to float16 produced inf/NaN while the module's output stayed finite: `aten.sum` (float16) on inputs with max |x| 2.2e+04: overflow: in FP32 the result reaches 2.46e+05, beyond float16's largest finite value 65504. A later op absorbed it (e.g. `x / inf` = 0), so the loss looks normal, the GradScaler never skips, and the result is silently wrong (the module was called at softmax_sum_overflow.py:36)
   fix:   keep `head` in FP32: `ampkit train --fp32-modules head` (Python: `MixedPrecision(..., fp32_modules=["head"])`; ...); start the FP16 loss scale at `--init-scale 8192` (`torch.amp.GradScaler(device_type, init_scale=8192)`) ...""",
    "nonfinite-backward": """1. nonfinite-backward — a gradient became inf/NaN · step 0
   where: model.pool · stats_pool_eps.py:23
   why:   the backward of model.pool (StatsPool) turned finite gradients into inf/NaN at `aten.div` (float16) on inputs with max |x| 0.00983, 0.35: underflow: the constant 1e-12 at stats_pool_eps.py:23 (`aten.add`) rounds to 0 in float16 (smallest positive value 5.96e-08), so it no longer keeps the divisor above 0: it divides by 0 (0/0 gives NaN, x/0 inf) in float16 (in the backward of `Sqrt`, SqrtBackward0); not the loss scale: with the scale (65536) divided out it is still inf/NaN, so the GradScaler skips every such step (the line is the forward op whose backward failed; ...)
   fix:   use an eps the low-precision dtype holds (FP16: 1e-5 or more; its smallest positive value is 6e-08), or compute this op in FP32; guard the op against its singular point ...""",
    "clip-before-unscale": """1. clip-before-unscale — gradients clipped while still multiplied by the loss scale · step 0
   where: train.py:15
   why:   `clip_grad_value_` clips gradients still multiplied by the loss scale ...
   fix:   call `scaler.unscale_(optimizer)` before `torch.nn.utils.clip_grad_value_(...)`, then `scaler.step(optimizer)` and `scaler.update()`""",
    "fp16-params-with-scaler": """1. fp16-params-with-scaler — FP16 parameters trained with a GradScaler · step 0
   where: finetune_half.py:22
   why:   6 parameters are FP16 (model.backbone.0.weight, model.backbone.0.bias, model.backbone.2.weight, ...) and a GradScaler unscales their gradients: torch refuses with "Attempting to unscale FP16 gradients"; FP16 weights also lose small updates (the GradScaler steps at finetune_half.py:30; the weights were made FP16 at finetune_half.py:22)
   fix:   keep the weights in FP32: remove the cast to FP16 at finetune_half.py:22 (`model = load_pretrained().half()`); ...""",
    "fp16-without-scaler": """1. fp16-without-scaler — FP16 autocast without a GradScaler: small gradients underflow to zero · step 1
   where: train.py:18
   why:   FP16 autocast without a GradScaler: 2 of 4 parameters have at least 50% of their gradient elements zero or subnormal (below 2^-14) ...""",
    "dtype-unsupported": """1. dtype-unsupported — a dtype this device cannot run · step 0
   where: lstm.py:11
   why:   an op has no kernel for this dtype on this device: RuntimeError: could not create a primitive descriptor for the LSTM forward propagation primitive ...
   fix:   use BF16 here: `torch.autocast('cpu', dtype=torch.bfloat16)` (no GradScaler needed; `ampkit train --precision bf16`): this device has no FP16 kernel for the op""",
    "scale-collapse": """1. scale-collapse — the loss scale keeps falling · step 9
   where: train.py:17
   why:   the loss scale fell from 65536 to 0.5 over 18 updates: the scale fell below 1 (0.5); gradients overflow FP16 on most steps, which are then skipped""",
    "scaler-not-checkpointed": """1. scaler-not-checkpointed — checkpoint without the GradScaler state · step 3
   where: train.py:12
   why:   `torch.save` writes model/optimizer state while an enabled GradScaler exists, and no save in this run included `scaler.state_dict()` ...""",
    "half-inside-autocast": """1. half-inside-autocast — manual cast to FP16 inside an autocast region · step 0
   where: train.py:13
   why:   `.half()` inside an autocast region: autocast already runs matmuls and convolutions in low precision ...""",
    "host-sync-per-step": """1. host-sync-per-step — host reads a device value every step · step 0
   where: train.py:18
   why:   `.item()` reads a device value on the host in 50 of 51 steps: each one waits for the device to finish all queued work""",
    "deprecated-amp-api": """train.py:4: deprecated-amp-api
-scaler = torch.cuda.amp.GradScaler()
+scaler = torch.amp.GradScaler("cuda")""",
    "unsafe-torch-load": """train.py:40: unsafe-torch-load
-state = torch.load(path)
+state = torch.load(path, weights_only=True)""",
    "hard-coded-device": """train.py:12: hard-coded-device
    with torch.amp.autocast("cuda", dtype=torch.float16):   # runs on CUDA only""",
    "scaler-with-bf16": """1. scaler-with-bf16 — an enabled GradScaler under BF16 autocast · step 0
   where: tiny_gpt.py:91
   why:   an enabled GradScaler scales a loss computed under BF16 autocast: BF16 has FP32's exponent range ...""",
    "bce-under-autocast": """1. bce-under-autocast — binary_cross_entropy under autocast · step 0
   where: vae.py:25
   why:   `binary_cross_entropy` (or `nn.BCELoss`) on bfloat16 probabilities under cpu autocast: CUDA and MUSA autocast refuse it as unsafe ...""",
    "accumulation-steps-every-microbatch": """1. accumulation-steps-every-microbatch — gradient accumulation that steps the optimizer at every micro-batch · step 2
   where: grad_accum_undivided.py:45
   why:   `scaler.step` stepped the optimizer 3 times in a row on gradients that were never cleared in between (no `zero_grad` between the steps): the gradients accumulate over micro-batches but the update is applied at every micro-batch; the loss was not divided by the number of micro-batches, so each step applies up to N times the gradient""",
    "scaler-updated-twice": """1. scaler-updated-twice — one GradScaler updated more than once per iteration · step 2
   where: shared_scaler_gan.py:38
   why:   one GradScaler is updated 2 times between two steps of the same optimizer (it is shared by 2 optimizers and `update()` runs after each): the scale grows and backs off twice as fast, and an overflow in one model's step lowers the scale for the other""",
    "grad-penalty-not-unscaled": """1. grad-penalty-not-unscaled — a gradient penalty computed from scaled gradients · step 0
   where: wgan_gp_unscaled.py:16
   why:   `torch.autograd.grad` of a `scaler.scale(...)` output returns gradients multiplied by the loss scale (65536), and they reach the loss without being divided by it: a gradient penalty built from them is off by the scale (squared: 4.29e+09x for ||grad||^2)""",
    "fp16-weights-without-master": """1. fp16-weights-without-master — FP16 weights trained without a master copy or a GradScaler · step 0
   where: half_plain_optimizer.py:38
   why:   6 of 6 parameters the optimizer updates are FP16 (`.half()`), with no GradScaler and no FP32 master copy: updates smaller than the weights' rounding step are lost, small gradients flush to zero, and a large one overflows to inf""",
    "scaler-update-missing": """1. scaler-update-missing — GradScaler stepped again without update() · step 1
   where: scaler_no_update.py:23
   why:   the script raised RuntimeError: unscale_() is being called after step(): the GradScaler stepped (or unscaled) this optimizer again without `scaler.update()` after its previous step""",
    "autograd-function-without-custom-fwd": """1. autograd-function-without-custom-fwd — a custom autograd.Function under autocast without custom_fwd/custom_bwd · step 0
   where: custom_fn_no_custom_fwd.py:26
   why:   the backward of the custom autograd.Function `LinearGELU` raised RuntimeError: expected m1 and m2 to have the same dtype, but got: c10::BFloat16 != float: its forward ran under autocast (low-precision outputs), its backward runs outside autocast on FP32 saved tensors, and the dtypes meet in one op""",
    "static-loss-scale": """1. static-loss-scale — a hand-rolled constant loss scale without a GradScaler · step 0
   where: static_loss_scale.py:30
   why:   the loss is multiplied by a constant 100000 before `backward()` under FP16 with no GradScaler (a hand-rolled static loss scale), and the backward overflowed: 6 of 6 gradients are inf/NaN; nothing skips such a step, so the optimizer writes inf/NaN into the weights (every later forward is NaN); ...""",
    "zero-grad-between-backward-and-step": """1. zero-grad-between-backward-and-step — gradients cleared between the backward and the optimizer step · step 0
   where: zero_grad_after_backward.py:43
   why:   `zero_grad()` at zero_grad_after_backward.py:43 cleared the gradients the backward had just produced, before the optimizer step: the step sees no gradients (all None), so nothing is learned (and `scaler.step` fails with "No inf checks were recorded")""",
    "scheduler-every-microbatch": """1. scheduler-every-microbatch — the LR scheduler stepped at every micro-batch under gradient accumulation · step 1
   where: scheduler_per_microbatch.py:47
   why:   `scheduler.step()` ran 4 times between two steps of its optimizer, with a backward between the calls: under gradient accumulation the learning-rate schedule advances per micro-batch, 4 times too fast (a schedule planned for the run ends after 1/4 of it)""",
    "bf16-weights-without-master": """1. bf16-weights-without-master — BF16 weights updated without an FP32 master copy · step 1
   where: bf16_pure_weights.py:25
   why:   the optimizer updates BF16 parameters with no FP32 master copy, and on this step 4723 of 4869 weight elements (97%) with a non-zero gradient kept their old value: each update was smaller than half the weight's BF16 rounding step (about 1/256 of the weight) and was rounded away""",
    "script-error": """Traceback (most recent call last):
  File "train.py", line 7, in <module>
    ...
RuntimeError: mat1 and mat2 shapes cannot be multiplied (2x4 and 3x3)

1. script-error — the script raised · step 0
   where: train.py:5
   why:   the script raised RuntimeError: mat1 and mat2 shapes cannot be multiplied (2x4 and 3x3)""",
    "script-exit": """1. script-exit — the script exited with a non-zero status · step 1
   where: train.py:11
   why:   the script called sys.exit(3): exit status 3, after 1 optimizer step(s)""",
}

HEAD = """# Finding codes

One registry (`ampkit.findings`) holds every code that `ampkit diagnose` (at run time) and `ampkit migrate`
(statically) report: its title, why it matters, the generic fix, and which commands report it. Codes are
stable (scripts and `ampkit migrate --select` depend on the spelling): they are added, never renamed. A
finding may carry a more specific fix than the generic one below, naming your module, line or function.

```python
from ampkit.findings import codes, info

print(codes("diagnose"))                       # the codes diagnose can report
entry = info("overflow-absorbed")
print(entry.title, "|", entry.fix)
```

For migrate's before/after of every code it reports, see [`ampkit migrate`, Finding codes](../commands/migrate.md#finding-codes).
"""


def section(code: str) -> str:
    e = info(code)
    by = " and ".join(f"`ampkit {c}`" for c in e.commands)
    return (f"## `{code}`\n\n**What it means.** {e.title[0].upper() + e.title[1:]}: {e.why}.\n\n"
            f"**Reported by:** {by}.\n\n**Example.**\n\n```text\n{EXAMPLES[code]}\n```\n\n**Fix.** {e.fix}.\n")


def render() -> str:
    rows = ["| code | title | diagnose | migrate |", "|---|---|---|---|"]
    for c in codes():
        e = info(c)
        rows.append(f"| [`{c}`](#{c}) | {e.title} | {'yes' if 'diagnose' in e.commands else '-'} | "
                    f"{'yes' if 'migrate' in e.commands else '-'} |")
    return HEAD + "\n" + "\n".join(rows) + "\n\n" + "\n".join(section(c) for c in codes())


def test_page_documents_every_code_from_the_registry():
    if os.environ.get("UPDATE_GOLDEN"):
        PAGE.write_text(render(), encoding="utf-8")
    assert set(EXAMPLES) == set(codes()), set(EXAMPLES) ^ set(codes())
    assert PAGE.read_text(encoding="utf-8") == render(), "docs/reference/findings.md is stale: UPDATE_GOLDEN=1"
