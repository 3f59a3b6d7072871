"""The precision x compile matrix: every runner on every configuration, in one process."""

from __future__ import annotations

import gc
import statistics
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable

import torch
from torch import nn

from ampkit.bench import measure
from ampkit.bench.report import evaluate_bars, make_notes
from ampkit.bench.ran_as import Substituted
from ampkit.bench.runners import PEERS, RUNNERS, Built, Ctx, Refused, Unavailable, build
from ampkit.bench.fp8rows import fp8_workloads
from ampkit.bench.workloads import Workload, load_workload
from ampkit.device import Device, detect_device
from ampkit.errors import PrecisionUnsupported, UsageError, first_line
from ampkit.device.policy import Precision, resolve_precision
from ampkit.device.provenance import git_commit

__all__ = ["BenchConfig", "run_bench", "BENCH_PRECISIONS"]

from ampkit.choices import BENCH_PRECISIONS, FP8_LAYERS, FP8_RECIPES  # noqa: E402  (BENCH_PRECISIONS re-exported)
Progress = Callable[[dict[str, Any]], None]
# torch.compile's modes, checked before anything is measured (this torch's own list where it gives one).
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def compile_modes() -> tuple[str, ...]:
    try:
        from torch._inductor import list_mode_options

        return tuple(list_mode_options()) or COMPILE_MODES
    except Exception:  # noqa: BLE001 - a torch without the listing: the documented modes
        return COMPILE_MODES


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    """What to measure. None means the device's default (see :func:`run_bench`)."""

    model: str | None = None  # gpt2-small on accelerators, digits on the CPU
    task_options: dict[str, Any] = field(default_factory=dict)
    precisions: tuple[str, ...] | None = None  # fp32 tf32 bf16 fp16 where the device has them
    eager: bool = True
    compile: bool = False
    compile_mode: str | None = None  # torch.compile(mode=...); None: the default mode
    compile_backend: str = "inductor"
    graph: bool = False  # add the whole-step graph runner to eager configurations
    runners: tuple[str, ...] | None = None
    steps: int | None = None  # timed steps per runner and round: 20 on accelerators, 10 on the CPU
    rounds: int | None = None  # interleaved rounds (plain, ampkit, plain, ...): 5 on accelerators, 1 on the CPU
    warmup: int | None = None  # 5 on accelerators, 2 on the CPU
    sync_steps: int = 3
    max_grad_norm: float = 1.0
    device: str | None = None
    seed: int = 0
    command: str | None = None
    # torchao's scaling for the fp8 rows, one recipe or several (rows "fp8-<recipe>" then): see FP8_RECIPES
    fp8_recipe: str | tuple[str, ...] = "tensorwise"
    fp8_layers: str = "paying"  # "paying": the layers the cost model predicts faster; "eligible": all the filter allows

    @property
    def fp8_recipes(self) -> tuple[str, ...]:
        return (self.fp8_recipe,) if isinstance(self.fp8_recipe, str) else tuple(dict.fromkeys(self.fp8_recipe))

    def validate(self) -> None:
        for p in self.precisions or ():
            if p not in BENCH_PRECISIONS:
                raise UsageError(f"unknown precision {p!r} for bench: use {', '.join(BENCH_PRECISIONS)}")
        for r in self.runners or ():
            if r not in RUNNERS:
                raise UsageError(f"unknown runner {r!r}: use {', '.join(RUNNERS)}")
        if not self.eager and not self.compile:
            raise UsageError("nothing to measure: --no-eager needs --compile")
        if self.steps is not None and self.steps < 1:
            raise UsageError(f"--steps must be >= 1, got {self.steps}")
        if self.rounds is not None and self.rounds < 1:
            raise UsageError(f"--rounds must be >= 1, got {self.rounds}")
        if self.warmup is not None and self.warmup < 0:
            raise UsageError(f"--warmup must be >= 0, got {self.warmup}")
        if self.runners and not self.eager and all(r in PEERS for r in self.runners):
            raise UsageError(f"nothing to measure: {', '.join(self.runners)} run eager only (they have no compiled "
                             f"path here): drop --no-eager or add plain or ampkit to --runners")
        if self.compile_mode is not None and self.compile_mode not in compile_modes():
            raise UsageError(f"--compile-mode {self.compile_mode!r} is not a torch.compile mode: use "
                             f"{', '.join(compile_modes())}")
        if self.compile_mode is not None and not self.compile:
            raise UsageError("--compile-mode sets how --compile compiles: add --compile")
        for recipe in self.fp8_recipes or ("",):
            if recipe not in FP8_RECIPES:
                raise UsageError(f"--fp8-recipe must be one of {', '.join(FP8_RECIPES)}, got {recipe!r}")
        if self.fp8_layers not in FP8_LAYERS:
            raise UsageError(f"--fp8-layers must be one of {', '.join(FP8_LAYERS)}, got {self.fp8_layers!r}")


class _LossModule(nn.Module):
    """model + loss as one module, so ``torch.compile`` fuses the loss (for an LM, the big
    cross-entropy over the vocabulary) into the compiled region."""

    def __init__(self, model: nn.Module, loss: Callable[[nn.Module, Any], torch.Tensor]) -> None:
        super().__init__()
        self.model = model
        self._loss = loss

    def forward(self, *batch: torch.Tensor) -> torch.Tensor:
        return self._loss(self.model, batch)


def _resolve(label: str, device: Device) -> Precision:
    if label == "tf32":
        return resolve_precision("fp32", device, tf32=True)
    if label == "fp32":
        return resolve_precision("fp32", device, tf32=False)
    return resolve_precision(label, device)


def _precisions(config: BenchConfig, device: Device, notes: list[str]) -> list[tuple[str, Precision]]:
    if config.precisions:
        out = []
        for label in dict.fromkeys(config.precisions):
            prec = _resolve(label, device)
            if label == "fp8" and len(config.fp8_recipes) > 1:  # one row label per recipe
                out.extend((f"fp8-{recipe}", prec) for recipe in config.fp8_recipes)
                continue
            out.append((label if label != "auto" else prec.name, prec))
        if not device.is_accelerator and all(label != "fp32" for label, _ in out):
            out.insert(0, ("fp32", _resolve("fp32", device)))
            notes.append("fp32 added as the reference: on the CPU autocast can be slower than FP32")
        return list({label: (label, prec) for label, prec in out}.values())
    wanted = ("fp32", "tf32", "bf16", "fp16") if device.is_accelerator else ("fp32", "bf16")
    out = []
    for label in wanted:
        try:
            out.append((label, _resolve(label, device)))
        except PrecisionUnsupported as exc:
            notes.append(f"{label} skipped: {exc}")
    return out


def _runners_for(config: BenchConfig, label: str, compiled: bool) -> list[str]:
    if config.runners:
        # FP8 rows: ampkit's engine and the hand-written torchao loop; the peers have no torchao FP8 path.
        return [r for r in config.runners if not ((compiled or label.startswith("fp8")) and r in PEERS)]
    if compiled or label.startswith("fp8"):
        # Compiled: the step captured whole (forward, backward, clip, fused optimizer) with --graph.
        # FP8: the peers and the lesson's loop have no torchao path.
        return ["plain", "ampkit"] + (["ampkit-graph"] if config.graph else [])
    names = ["plain", "ampkit"]
    if config.graph:
        names.append("ampkit-graph")
    names.append("lesson")
    if label in ("bf16", "fp16"):
        names.extend(PEERS)
    return names


def _versions(device: Device) -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    import ampkit

    out: dict[str, Any] = {"ampkit": ampkit.__version__, "git_commit": git_commit(), **device.runtime_versions()}
    for pkg in ("accelerate", "lightning", "torchvision", "transformers", "torchao"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def run_bench(config: BenchConfig, progress: Progress | None = None) -> dict[str, Any]:
    """Measure every runner on every (precision, compiled) configuration; return the result object
    (the JSON of ``ampkit bench --json``): device, versions, matmul rate, rows, bars and notes."""
    config.validate()
    report = progress or (lambda ev: None)
    device = detect_device(config.device)
    notes: list[str] = []
    spec = config.model or ("gpt2-small" if device.is_accelerator else "digits")
    precisions = _precisions(config, device, notes)
    steps = config.steps or (20 if device.is_accelerator else 10)
    warmup = config.warmup if config.warmup is not None else (5 if device.is_accelerator else 2)
    device.manual_seed(config.seed)
    wl = load_workload(spec, device, seed=config.seed, options=config.task_options)
    report({"event": "start", "model": wl.name, "device": str(device), "name": device.name})
    peak = measure.matmul_rate(device)
    report({"event": "peak", **peak})

    modes = ([False] if config.eager else []) + ([True] if config.compile else [])
    # FP8 rows train copies of the model with torchao's Float8Linear layers (one per recipe and mode: the plan
    # differs eager and compiled); the other rows train the model as it is.
    workloads, plans = fp8_workloads(config, wl, precisions, modes, notes, progress=report)
    compiled_fwds = _compiled_forwards(config, workloads)
    tf32_before = device.tf32_switches()
    rounds = config.rounds or (5 if device.is_accelerator else 1)
    configs = [(label, prec, compiled, _runners_for(config, label, compiled))
               for label, prec in precisions for compiled in modes]
    total = sum(len(runners) for *_, runners in configs) * rounds
    rows: list[dict[str, Any]] = []
    compile_error: str | None = None
    index = 0
    try:
        for label, prec, compiled, runners in configs:
            measured: dict[str, list[dict[str, Any]]] = {r: [] for r in runners}
            for rnd in range(rounds):
                # Interleaved, and the order reversed every other round: a clock that drifts (boost, heat,
                # another tenant) then weighs on every runner alike instead of on whichever ran last.
                for runner in (runners if rnd % 2 == 0 else runners[::-1]):
                    report({"event": "runner", "index": index, "total": total, "precision": label,
                            "compiled": compiled, "runner": runner, "round": rnd})
                    index += 1
                    key = (label, compiled) if label.startswith("fp8") else ("", False)
                    if isinstance(workloads[key], str):
                        row = _row(label, prec, compiled, runner, status="refused", message=workloads[key])
                    elif compiled and compile_error:
                        row = _row(label, prec, compiled, runner, status="error",
                                   message=f"compile failed: {compile_error}")
                    else:
                        w = workloads[key]
                        fwd = ((lambda b, m=compiled_fwds.get(key): m(*b)) if compiled
                               else (lambda b, w=w: w.loss(w.model, b)))
                        row = _measure(w, device, label, prec, compiled, runner, fwd, config, steps, warmup,
                                       peak["flops_per_s"], check_syncs=rnd == 0)
                        if compiled and row["status"] == "error" and runner == "plain":
                            compile_error = row["message"]
                    measured[runner].append(row)
                    report({"event": "round", "row": row, "round": rnd})
            for runner in runners:
                rows.append(combine_rounds(measured[runner]))
            _ratios(rows)
            for runner in runners:
                report({"event": "row", "row": next(r for r in rows if (r["precision"], r["compiled"], r["runner"])
                                                    == (label, compiled, runner))})
    finally:
        device.restore_tf32(tf32_before)  # each switch to its own value (cuBLAS and cuDNN differ by default)
    settings = {"steps": steps, "warmup": warmup, "rounds": rounds}
    if plans:
        recipes = config.fp8_recipes
        settings.update(fp8_recipe=recipes[0] if len(recipes) == 1 else list(recipes), fp8_layers=config.fp8_layers)
    result = _result(config, device, wl, peak, settings, rows, notes)
    if plans:
        result["fp8_plans"] = plans
    return result


def _compiled_forwards(config: BenchConfig, workloads: dict[bool, Any]) -> dict[bool, Any]:
    """The loss of each workload (as it is, and its FP8 copy) under ``torch.compile``; {} without --compile."""
    if not config.compile:
        return {}
    kw = {"backend": config.compile_backend}
    if config.compile_mode:
        kw["mode"] = config.compile_mode
    return {key: torch.compile(_LossModule(w.model, w.loss), **kw) for key, w in workloads.items()
            if not isinstance(w, str) and (key[1] or not key[0])}


def _result(config: BenchConfig, device: Any, wl: Any, peak: dict[str, Any], settings: dict[str, Any],
            rows: list[dict[str, Any]], notes: list[str]) -> dict[str, Any]:
    """The result object (the JSON of ``ampkit bench --json``), with its bars and notes."""
    result: dict[str, Any] = {
        "schema": 1,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": config.command,
        "device": {"type": device.type, "name": device.name, "capability": device.capability,
                   "total_memory": device.total_memory},
        "versions": _versions(device),
        "model": wl.to_dict(),
        "peak": peak,
        "settings": {"steps": settings["steps"], "warmup": settings["warmup"], "rounds": settings["rounds"],
                     "max_grad_norm": config.max_grad_norm,
                     "compile_mode": config.compile_mode or "default", "compile_backend": config.compile_backend,
                     "optimizer": wl.optimizer_name + " (lesson runner: the default foreach/for-loop form)",
                     "sync_steps": config.sync_steps, "seed": config.seed,
                     **{k: settings[k] for k in ("fp8_recipe", "fp8_layers") if k in settings}},
        "rows": rows,
    }
    result["bars"] = evaluate_bars(result)
    result["notes"] = notes + make_notes(result)
    return result


def _row(label: str, prec: Precision, compiled: bool, runner: str, **kw: Any) -> dict[str, Any]:
    row = {"precision": label, "compiled": compiled, "runner": runner, "status": "ok", "message": None,
           "ms_per_step": None, "tokens_per_s": None, "samples_per_s": None, "mfu": None, "peak_mem_bytes": None,
           "ratio_to_plain": None, "host_syncs_per_step": None, "sync_error": None, "loss_last": None,
           "warmup_s": None, "tf32": prec.tf32, "ms_rounds": None, "ms_spread": None, "ratio_rounds": None,
           "ratio_spread": None, "ratio_verdict": None}
    row.update(kw)
    return row


def _measure(wl: Workload, device: Device, label: str, prec: Precision, compiled: bool, runner: str,
             fwd: Callable[[Any], torch.Tensor], config: BenchConfig, steps: int, warmup: int,
             peak_rate: float, *, check_syncs: bool = True) -> dict[str, Any]:
    wl.reset()
    device.manual_seed(config.seed)  # dropout draws the same masks in every runner: comparable losses
    gc.collect()
    device.empty_cache()
    device.reset_peak_memory_stats()
    ctx = Ctx(model=wl.model, loss=wl.loss, forward=fwd, example_batch=wl.batches[0], precision=prec,
              device=device, optimizer=wl.optimizer, max_grad_norm=config.max_grad_norm,
              compiled=compiled)
    built: Built | None = None
    try:
        built = build(runner, ctx)
        device.set_tf32(prec.tf32)
        t = measure.time_steps(built.step, wl.batches, device, warmup=warmup + built.extra_warmup, steps=steps)
        peak_mem = device.max_memory_allocated()
        loss_last = float(t["last_loss"].float().item())
        extra = built.finish() if built.finish else {}
        offset = warmup + built.extra_warmup + steps
        syncs = sync_error = None
        if check_syncs:
            syncs = measure.count_syncs(built.step, wl.batches, device, n=config.sync_steps, offset=offset)
        if check_syncs and runner.startswith("ampkit"):
            sync_error = measure.strict_sync_check(built.step, wl.batches, device, n=config.sync_steps,
                                                   offset=offset + config.sync_steps)
    except Substituted as exc:  # a peer ran another precision than asked: no row under the wrong label
        return _row(label, prec, compiled, runner, status="substituted", message=str(exc))
    except Refused as exc:
        return _row(label, prec, compiled, runner, status="refused", message=str(exc))
    except Unavailable as exc:
        return _row(label, prec, compiled, runner, status="unavailable", message=str(exc))
    except Exception as exc:  # noqa: BLE001 - one configuration failing must not lose the others
        return _row(label, prec, compiled, runner, status="error", message=first_line(exc, 300))
    finally:
        if built is not None and built.cleanup is not None:
            built.cleanup()
        built = None
        wl.reset()
    s = t["s_per_step"]
    return _row(label, prec, compiled, runner, ms_per_step=s * 1e3,
                tokens_per_s=(wl.tokens_per_step / s) if wl.tokens_per_step else None,
                samples_per_s=wl.samples_per_step / s, peak_mem_bytes=peak_mem,
                mfu=(wl.flops_per_step / s / peak_rate) if wl.flops_per_step and peak_rate else None,
                host_syncs_per_step=syncs, sync_error=sync_error, loss_last=loss_last,
                warmup_s=round(t["warmup_s"], 3), **extra)


def combine_rounds(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One row from a runner's interleaved rounds: the median step time, every round's time and their spread.
    Memory, syncs and ``loss_last`` come from the first round (the only one that checks syncs); ``loss_rounds``
    holds every round's last loss (a rerun of the same steps: their differences are the device's nondeterminism)."""
    bad = next((r for r in rounds if r["status"] != "ok"), None)
    if bad is not None:
        return bad
    row = dict(rounds[0])
    times = [r["ms_per_step"] for r in rounds]
    median = statistics.median(times)
    scale = row["ms_per_step"] / median  # rates follow the median time
    for key in ("tokens_per_s", "samples_per_s", "mfu"):
        if row[key] is not None:
            row[key] *= scale
    row.update(ms_per_step=median, ms_rounds=times, ms_spread=[min(times), max(times)],
               loss_rounds=[r.get("loss_last") for r in rounds])  # each round: the same steps from the same weights
    return row


def _ratios(rows: list[dict[str, Any]]) -> None:
    """Each runner's time over the hand-written loop's, round by round (a round's runners ran back to back,
    so each pair shares the device's state): the median ratio, its spread, and whether the spread is wider
    than the effect, in which case the row says so instead of claiming the number."""
    plain = {(r["precision"], r["compiled"]): r for r in rows if r["runner"] == "plain" and r["status"] == "ok"}
    for r in rows:
        base = plain.get((r["precision"], r["compiled"]))
        if r["status"] != "ok" or base is None:
            continue
        ratios = [a / b for a, b in zip(r.get("ms_rounds", [r["ms_per_step"]]),
                                        base.get("ms_rounds", [base["ms_per_step"]]))]
        median = statistics.median(ratios)
        r["ratio_to_plain"] = median
        r["ratio_rounds"] = ratios
        r["ratio_spread"] = [min(ratios), max(ratios)]
        half = (max(ratios) - min(ratios)) / 2
        if len(ratios) < 2:
            r["ratio_verdict"] = "one round: no spread measured (use --rounds 3 or more)"
        elif r["runner"] == "plain":
            r["ratio_verdict"] = None
        elif half > abs(median - 1.0):
            r["ratio_verdict"] = (f"within noise: the rounds' spread (+/-{half:.1%}) is wider than the difference "
                                  f"({median - 1:+.1%}): this run cannot tell the overhead from noise")
        else:
            r["ratio_verdict"] = f"{median - 1:+.1%} (spread +/-{half:.1%} over {len(ratios)} rounds)"
