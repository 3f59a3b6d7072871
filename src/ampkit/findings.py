"""The one finding registry: every stable code that ``ampkit diagnose`` or ``ampkit migrate`` reports,
with its title, why it matters, the generic fix, and which commands can produce it.

Codes are a promise (DESIGN.md): extend, never rename. A command's finding may carry a more specific
fix (naming the module, the line or the user's own variables); the text here is the generic one, and
it lives only here (the docs page ``docs/reference/findings.md`` is checked against it).

>>> from ampkit.findings import info, codes
>>> info("clip-before-unscale").title
'gradients clipped while still multiplied by the loss scale'
>>> "deprecated-amp-api" in codes("migrate")
True
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DIAGNOSE", "MIGRATE", "CodeInfo", "REGISTRY", "codes", "info", "fix_for", "title_for"]

DIAGNOSE = "diagnose"
MIGRATE = "migrate"


@dataclass(frozen=True, kw_only=True)
class CodeInfo:
    """One finding code: ``title`` (one line), ``why`` (what goes wrong if it stays), ``fix`` (the generic
    fix), ``commands`` (which of ``diagnose`` / ``migrate`` can report it)."""

    code: str
    title: str
    why: str
    fix: str
    commands: tuple[str, ...]


def _c(code: str, commands: tuple[str, ...], title: str, why: str, fix: str) -> CodeInfo:
    return CodeInfo(code=code, title=title, why=why, fix=fix, commands=commands)


_BOTH = (DIAGNOSE, MIGRATE)

_ALL: tuple[CodeInfo, ...] = (
    _c("nonfinite-forward", (DIAGNOSE,),
       "a forward output became inf/NaN",
       "an op overflowed its dtype (FP16's largest value is 65504) or hit a singular point; the loss and "
       "every gradient after it are inf/NaN, so the step is skipped or the weights are destroyed",
       "keep the named module in FP32 (`ampkit train --fp32-modules MODULE`, `MixedPrecision(..., "
       "fp32_modules=[\"MODULE\"])`, or by hand `with torch.autocast(device_type, enabled=False): "
       "y = module(x.float())`), rescale its inputs or weights, or use BF16 where the card has it; "
       "`ampkit diagnose --fp16-range SCRIPT` predicts which modules overflow FP16"),
    _c("overflow-absorbed", (DIAGNOSE,),
       "an op overflowed inside a module whose output stayed finite",
       "an intermediate op produced inf/NaN in FP16/BF16 and a later op turned it back into finite "
       "numbers (`x / inf` = 0, `exp(-inf)` = 0, a masked max): the loss stays finite, the GradScaler "
       "never skips, and the run is silently wrong",
       "keep the named module in FP32 (`ampkit train --fp32-modules MODULE`, `MixedPrecision(..., "
       "fp32_modules=[\"MODULE\"])`), or rewrite the op so it cannot overflow (e.g. scale before squaring, "
       "`torch.linalg.vector_norm`, `F.normalize`); with FP16 start the GradScaler at the scale "
       "`ampkit diagnose --fp16-range SCRIPT` recommends (`ampkit train --init-scale X`)"),
    _c("nonfinite-backward", (DIAGNOSE,),
       "a gradient became inf/NaN",
       "a backward op overflowed or hit a singular point (sqrt or log at 0, division by 0); the optimizer "
       "step writes inf/NaN into the weights unless a GradScaler skips it",
       "guard the op against its singular point (e.g. `torch.sqrt(x + eps)`, `x.clamp_min(eps)`), "
       "lower the learning rate, or clip gradients"),
    _c("clip-before-unscale", _BOTH,
       "gradients clipped while still multiplied by the loss scale",
       "the clip threshold acts on values multiplied by the loss scale (65536 at the start), so it clips "
       "far too much, and how much changes whenever the scale does",
       "call `scaler.unscale_(optimizer)` before clipping (`torch.nn.utils.clip_grad_norm_` or "
       "`clip_grad_value_`), then `scaler.step(optimizer)` and `scaler.update()`"),
    _c("fp16-params-with-scaler", (DIAGNOSE,),
       "FP16 parameters trained with a GradScaler",
       "torch refuses to unscale FP16 gradients (\"Attempting to unscale FP16 gradients\"), and FP16 "
       "weights lose every update smaller than their rounding step",
       "keep the model in FP32 (remove `model.half()` / `.to(torch.float16)`) and let "
       "`torch.autocast(device_type, dtype=torch.float16)` cast per op: the optimizer then "
       "updates FP32 master weights and the scaler can unscale FP32 gradients"),
    _c("fp16-without-scaler", (DIAGNOSE,),
       "FP16 autocast without a GradScaler: small gradients underflow to zero",
       "FP16 flushes values below 2^-24 to zero and keeps few bits below 2^-14; without loss scaling many "
       "gradient elements vanish and those weights stop learning",
       "create `scaler = torch.amp.GradScaler(device_type)` and use `scaler.scale(loss).backward()`, "
       "`scaler.step(optimizer)`, `scaler.update()`; or use BF16 where the card has it (`ampkit doctor`)"),
    _c("dtype-unsupported", (DIAGNOSE,),
       "a dtype this device cannot run",
       "the card (or the backend, e.g. FP16 recurrent layers on the CPU) has no kernels for the dtype: the "
       "run fails, or on some cards runs through slow or unverified emulation",
       "use the dtype the device supports (`ampkit doctor` names it: BF16 where the card has it; MTT "
       "S80/S3000: `dtype=torch.float16` with a GradScaler), or check first with "
       "`ampkit doctor --precision bf16`; a layer with no low-precision kernel at all here (an LSTM on a CPU "
       "without AVX-512) runs in FP32 under `torch.autocast(device_type, enabled=False)`"),
    _c("scale-collapse", (DIAGNOSE,),
       "the loss scale keeps falling",
       "something overflows FP16 on most steps: the GradScaler skips them and backs off until the scale is "
       "tiny, and the model stops learning",
       "run `ampkit diagnose --fp16-range SCRIPT` to find the module, keep it in FP32 "
       "(`--fp32-modules MODULE`), lower the learning rate or the loss magnitude, or use BF16 where the "
       "card has it"),
    _c("scaler-not-checkpointed", (DIAGNOSE,),
       "checkpoint without the GradScaler state",
       "a resumed run restarts the scale at its initial value: extra skipped steps and different numbers "
       "than a run that never stopped",
       "save `scaler.state_dict()` with the model and optimizer "
       "(`torch.save({'model': ..., 'optimizer': ..., 'scaler': scaler.state_dict()}, path)`) "
       "and restore it with `scaler.load_state_dict(...)`"),
    _c("half-inside-autocast", _BOTH,
       "manual cast to FP16 inside an autocast region",
       "autocast already casts per op; a manual cast also forces FP16 on ops autocast keeps in FP32 "
       "(softmax, norms, losses) and, on a parameter or a model, gives FP16 weights",
       "remove the manual `.half()` / `.to(torch.float16)`: autocast already casts per op and keeps "
       "precision-sensitive ops (softmax, norms, losses) in FP32"),
    _c("host-sync-per-step", _BOTH,
       "host reads a device value every step",
       "`.item()`, `float(t)`, `if tensor:` wait for the device to finish all queued work: the host stops "
       "running ahead and the accelerator idles between steps",
       "keep values on the device and read them every N steps (`loss.detach()` into a list, "
       "`torch.stack(...).mean().item()` when logging); let the GradScaler skip non-finite steps "
       "instead of `if not torch.isfinite(loss)`"),
    _c("deprecated-amp-api", (MIGRATE,),
       "deprecated AMP API",
       "the per-backend `torch.<backend>.amp.*` APIs (`torch.cpu.amp.*` and the accelerators' alike) are "
       "deprecated (warnings today, removal later) and tie the code to one vendor; the device-agnostic "
       "`torch.amp` API runs on MUSA, CUDA and the CPU",
       "run `ampkit migrate --fix PATH`"),
    _c("unsafe-torch-load", (MIGRATE,),
       "torch.load without weights_only=True",
       "a full unpickle runs whatever code the file names",
       "pass `weights_only=True` where the file holds tensors and state dicts (run `ampkit migrate --fix "
       "PATH`); for other objects register them with `torch.serialization.add_safe_globals`, or save "
       "state dicts instead"),
    _c("hard-coded-device", (MIGRATE,),
       "an AMP call with the device hard-coded to one vendor",
       "`torch.amp.autocast(\"<vendor>\")` / `GradScaler(\"<vendor>\")` with no device variable in reach runs "
       "on that vendor only: on MUSA or the CPU autocast is off or the scaler fails; a `GradScaler()` given no "
       "device at all is a \"cuda\" scaler, which disables itself where CUDA is absent (FP16 then trains "
       "without loss scaling)",
       "pass the device in and use its type: `torch.amp.autocast(device.type, ...)`, "
       "`torch.amp.GradScaler(device.type, ...)`"),
    _c("scaler-with-bf16", _BOTH,
       "an enabled GradScaler under BF16 autocast",
       "BF16 has FP32's exponent range and needs no loss scaling: the scaling, its inf checks and its "
       "host reads are wasted work",
       "`torch.amp.GradScaler(device_type, enabled=(dtype == torch.float16))`"),
    _c("bce-under-autocast", _BOTH,
       "binary_cross_entropy under autocast",
       "torch refuses `binary_cross_entropy` / `nn.BCELoss` under autocast: a sigmoid in FP16 saturates "
       "to exactly 0 or 1 and the log then gives inf",
       "use `torch.nn.BCEWithLogitsLoss` / `F.binary_cross_entropy_with_logits` on the logits (drop the "
       "final sigmoid)"),
    _c("accumulation-steps-every-microbatch", (DIAGNOSE,),
       "gradient accumulation that steps the optimizer at every micro-batch",
       "the gradients are summed over micro-batches (no `zero_grad` between steps) but `scaler.step` runs "
       "at every one of them: each update applies a growing partial sum, usually of an undivided loss, so "
       "the effective learning rate is up to N times too large and the run differs from one large batch",
       "divide the loss by the number of micro-batches (`loss = loss / accum_steps`), and call "
       "`scaler.step(optimizer)`, `scaler.update()` and `optimizer.zero_grad()` only every `accum_steps` "
       "micro-batches (`if (i + 1) % accum_steps == 0:`)"),
    _c("scaler-updated-twice", (DIAGNOSE,),
       "one GradScaler updated more than once per iteration",
       "a GradScaler shared by two models and updated after each model's step moves its scale twice "
       "per iteration, and an overflow in one model's gradients lowers the scale for the other: torch's "
       "AMP recipe for several models and optimizers updates the scaler once per iteration",
       "call `scaler.step(opt_a)` and `scaler.step(opt_b)`, then `scaler.update()` once at the end of the "
       "iteration; or give each model its own `torch.amp.GradScaler(device_type)`"),
    _c("grad-penalty-not-unscaled", (DIAGNOSE,),
       "a gradient penalty computed from scaled gradients",
       "`torch.autograd.grad(scaler.scale(out), inputs, create_graph=True)` returns gradients multiplied by "
       "the loss scale; a penalty built from them (WGAN-GP, R1) is off by the scale (its square for a "
       "squared norm), so it dominates the loss and changes whenever the scale does",
       "divide the gradients by the scale before using them: `inv_scale = 1.0 / scaler.get_scale()`, "
       "`grads = [g * inv_scale for g in scaled_grads]` (torch's AMP examples, \"gradient penalty\"); or "
       "compute the penalty from `torch.autograd.grad(out, ...)` of the unscaled output"),
    _c("fp16-weights-without-master", (DIAGNOSE,),
       "FP16 weights trained without a master copy or a GradScaler",
       "after `model.half()` the optimizer updates the FP16 weights themselves: an update smaller than "
       "the weight's rounding step (about 1/1000 of it) is lost, small gradients flush to zero without loss "
       "scaling, and one large gradient overflows to inf; the first non-finite forward follows from that",
       "remove `model.half()`: keep the weights in FP32 and run the forward under "
       "`torch.autocast(device_type, dtype=torch.float16)` with `scaler = torch.amp.GradScaler(device_type)` "
       "(`ampkit train --precision fp16`); or use BF16 where the card has it"),
    _c("scaler-update-missing", (DIAGNOSE,),
       "GradScaler stepped again without update()",
       "torch refuses a second `scaler.step` / `scaler.unscale_` on an optimizer before `scaler.update()` "
       "(\"unscale_() has already been called on this optimizer since the last update()\"): without "
       "`update()` the scale never adapts and the inf checks of the last step are never consumed",
       "call `scaler.update()` once per iteration, after `scaler.step(optimizer)` (after the last optimizer's "
       "step when there are several)"),
    _c("autograd-function-without-custom-fwd", (DIAGNOSE,),
       "a custom autograd.Function under autocast without custom_fwd/custom_bwd",
       "autocast casts the ops inside the Function's forward, but its backward runs outside autocast: the "
       "incoming gradient is FP16/BF16 while the saved tensors are FP32, and a matmul between them fails "
       "with a dtype mismatch (or silently runs in another precision)",
       "decorate the Function's `forward` with `@torch.amp.custom_fwd(device_type=...)` and its `backward` "
       "with `@torch.amp.custom_bwd(device_type=...)` (or `custom_fwd(device_type=..., cast_inputs=torch.float32)` "
       "to run it in FP32)"),
    _c("static-loss-scale", (DIAGNOSE,),
       "a hand-rolled constant loss scale without a GradScaler",
       "the loss is multiplied by a constant (`(loss * 1e5).backward()`, gradients divided afterwards) under "
       "FP16 with no GradScaler: when the backward overflows nothing skips the step, the optimizer writes "
       "inf/NaN into the weights, and a constant cannot back off (or grow) as the gradients change",
       "replace the constant with `scaler = torch.amp.GradScaler(device_type)`: `scaler.scale(loss).backward()`, "
       "`scaler.step(optimizer)`, `scaler.update()` (it skips overflowing steps and adapts the scale), and remove "
       "the manual division of the gradients; or use BF16 where the card has it"),
    _c("zero-grad-between-backward-and-step", (DIAGNOSE,),
       "gradients cleared between the backward and the optimizer step",
       "`optimizer.zero_grad()` (or `model.zero_grad()`) runs after `loss.backward()` / "
       "`scaler.scale(loss).backward()` and before `optimizer.step()` / `scaler.step(optimizer)`: the step "
       "sees no gradients, nothing is learned, and `scaler.step` fails with \"No inf checks were recorded\"",
       "clear the gradients before the backward (at the top of the iteration) or after the step: "
       "`optimizer.zero_grad(set_to_none=True)`, `scaler.scale(loss).backward()`, `scaler.step(optimizer)`, "
       "`scaler.update()`"),
    _c("scheduler-every-microbatch", (DIAGNOSE,),
       "the LR scheduler stepped at every micro-batch under gradient accumulation",
       "`scheduler.step()` runs per micro-batch while the optimizer steps once per N micro-batches: the "
       "learning-rate schedule runs N times too fast (warm-up over too soon, the LR at its floor after 1/N "
       "of the run)",
       "call `scheduler.step()` only when the optimizer steps: inside `if (i + 1) % accum_steps == 0:`, after "
       "`scaler.step(optimizer)` / `optimizer.step()`"),
    _c("bf16-weights-without-master", (DIAGNOSE,),
       "BF16 weights updated without an FP32 master copy",
       "after `model.to(torch.bfloat16)` the optimizer updates the BF16 weights themselves: BF16 keeps 8 "
       "significant bits, so an update smaller than half the weight's rounding step (about 1/256 of the "
       "weight) is rounded away and those weights stop learning; a small learning rate loses most updates",
       "keep an exact FP32 value per weight with the memory of BF16: `ampkit.MixedPrecision('bf16', weights='bf16')` "
       "and `amp.attach(model)` before training (BF16 weights plus a 16-bit remainder each; `--weights bf16`); or "
       "keep the weights in FP32 and run the forward under `torch.autocast(device_type, dtype=torch.bfloat16)` "
       "(no GradScaler needed; `ampkit train --precision bf16`); or, for pure-BF16 training by design, use an "
       "optimizer that compensates the rounding (stochastic rounding or Kahan summation, e.g. torchao's "
       "`_AdamW(..., bf16_stochastic_round=True)`)"),
    # Not defects of AMP use: how the script itself ended, when diagnose could not map it to a code above.
    _c("script-error", (DIAGNOSE,),
       "the script raised",
       "the script stopped with an exception that is not a known AMP defect; diagnose saw the steps before it",
       "fix the error shown (the script's own traceback is printed above the findings)"),
    _c("script-exit", (DIAGNOSE,),
       "the script exited with a non-zero status",
       "the script called `sys.exit(N)` (or `exit(N)`) itself; diagnose saw the steps before it",
       "see the script's own output for why it stopped; pass the arguments it needs after SCRIPT "
       "(`ampkit diagnose SCRIPT ARGS...`)"),
)

REGISTRY: dict[str, CodeInfo] = {c.code: c for c in _ALL}


def codes(command: str | None = None) -> tuple[str, ...]:
    """Every code, or those ``command`` (``"diagnose"`` / ``"migrate"``) can report, in registry order."""
    return tuple(c.code for c in _ALL if command is None or command in c.commands)


def info(code: str) -> CodeInfo:
    """The registry entry of ``code`` (KeyError for an unknown code: codes are a closed, stable set)."""
    return REGISTRY[code]


def fix_for(code: str) -> str:
    """The generic fix for ``code``."""
    return REGISTRY[code].fix


def title_for(code: str) -> str:
    """The one-line title of ``code``."""
    return REGISTRY[code].title
