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
   where: model.2 · train.py:15
   why:   the output of model.2 (Linear) became inf/NaN under cuda autocast to float16 at `aten.addmm.default` (float16) on inputs with max |x| 0.125, 11.2, 1.25e+04; FP16's largest finite value is 65504
   fix:   keep `2` in FP32: `ampkit train --fp32-modules 2` (Python: `MixedPrecision(..., fp32_modules=["2"])`; ...); `ampkit diagnose --fp16-range SCRIPT` gives the initial loss scale (`--init-scale X`) ...""",
    "overflow-absorbed": """1. overflow-absorbed — an op overflowed inside a module whose output stayed finite · step 0
   where: model.1 · train.py:20 (forward defined at train.py:10)
   why:   an op inside model.1 (HandNorm) under cpu autocast to float16 produced inf/NaN while the module's output stayed finite: `aten.pow.Tensor_Scalar` (float16) on inputs with max |x| 713; FP16's largest finite value is 65504. A later op absorbed it (e.g. `x / inf` = 0), so the loss looks normal, the GradScaler never skips, and the result is silently wrong
   fix:   keep `1` in FP32: `ampkit train --fp32-modules 1` (Python: `MixedPrecision(..., fp32_modules=["1"])`; ...); start the FP16 loss scale at `--init-scale 16384` (`torch.amp.GradScaler(device_type, init_scale=16384)`) ...""",
    "nonfinite-backward": """1. nonfinite-backward — a gradient became inf/NaN · step 0
   where: model.1 · train.py:19 (forward defined at train.py:7)
   why:   the backward of model.1 (Magnitude) turned finite gradients into inf/NaN at `aten.div.Tensor` (float32) ...""",
    "clip-before-unscale": """1. clip-before-unscale — gradients clipped while still multiplied by the loss scale · step 0
   where: train.py:15
   why:   `clip_grad_value_` clips gradients still multiplied by the loss scale ...
   fix:   call `scaler.unscale_(optimizer)` before `torch.nn.utils.clip_grad_value_(...)`, then `scaler.step(optimizer)` and `scaler.update()`""",
    "fp16-params-with-scaler": """1. fp16-params-with-scaler — FP16 parameters trained with a GradScaler · step 0
   where: finetune.py:30
   why:   the script raised ValueError: Attempting to unscale FP16 gradients.""",
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
