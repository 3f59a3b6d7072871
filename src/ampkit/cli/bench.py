"""``ampkit bench``: the precision x compile matrix on this device (thin: parse, call, render)."""

from __future__ import annotations

import json
import shlex
import sys

from ampkit.cli.common import add_device_arg, add_fp8_recipe_arg, check_writable, console, err_console, print_json
from ampkit.cli.fp8view import fp8_trial_line
from ampkit.cli.hardstop import exit_promptly

__all__ = ["register", "run"]

EXAMPLES = """examples:
  ampkit bench                                   # gpt2-small on a GPU, digits on the CPU; every precision
  ampkit bench --model gpt2-small --precision bf16 fp16 --compile
  ampkit bench --model lesson --precision fp16 --graph     # whole-step graph vs the lesson's loop
  ampkit bench --model gpt2-small --precision bf16 fp8 --graph --compile   # FP8 (torchao) beside BF16
  ampkit bench --model llama-1b --precision bf16 fp8 --compile --fp8-recipe tensorwise rowwise  # FP8 at scale
  ampkit bench --model charlm --task-arg d_model=256 --steps 10
  ampkit bench --model mytask.py:make_task --json > bench.json

columns: ms/step (device events around the timed steps), tokens/s or samples/s, MFU (model FLOPs per
second / the matmul rate measured in the same run), peak memory, x plain (step time / the hand-written
torch loop's), syncs/step (host-device synchronisations, counted by the sync debug mode)."""


def register(sub, formatter_class):
    from ampkit.choices import BENCH_PRECISIONS, BENCH_RUNNERS as RUNNERS

    p = sub.add_parser("bench", help="step time, throughput, MFU, peak memory and engine overhead per precision",
                       description="Time the AMP engine against a hand-written torch loop, the lesson's loop and "
                                   "(when installed) Accelerate and Lightning Fabric, per precision, eager and "
                                   "compiled, on the present device. Results are figures for this run only.",
                       epilog=EXAMPLES, formatter_class=formatter_class)
    p.add_argument("--model", default=None, metavar="M",
                   help="gpt2-small | llama-1b | charlm | digits | lesson | resnet50 | hf-gpt2 | FILE.py:factory "
                        "(default: gpt2-small on a GPU, "
                        "digits on the CPU)")
    p.add_argument("--task-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="option for the task factory, repeatable (e.g. d_model=256)")
    p.add_argument("--precision", nargs="+", default=None, metavar="P",
                   help=f"one or more of {' | '.join(BENCH_PRECISIONS)} (tf32: fp32 with TF32 matmuls; fp8: torchao's "
                        "Float8Linear under BF16 autocast, asked for by name); default: every one the device has but fp8")
    add_fp8_recipe_arg(p, "the fp8 rows", several=True)
    p.add_argument("--compile", action="store_true", help="also measure torch.compile'd model + loss")
    p.add_argument("--no-eager", action="store_true", help="with --compile: compiled configurations only")
    p.add_argument("--compile-mode", default=None, metavar="MODE",
                   help="with --compile: torch.compile's mode (reduce-overhead, max-autotune, "
                        "max-autotune-no-cudagraphs; not given: torch's own)")
    p.add_argument("--graph", action="store_true", help="add the whole-step graph runner (MixedPrecision(graph=True))")
    p.add_argument("--runners", default=None, metavar="LIST", help=f"comma list of {', '.join(RUNNERS)}")
    p.add_argument("--steps", type=int, default=None, metavar="N", help="timed steps per runner (20 GPU, 10 CPU)")
    p.add_argument("--warmup", type=int, default=None, metavar="W", help="untimed steps first (5 GPU, 2 CPU)")
    p.add_argument("--rounds", type=int, default=None, metavar="R",
                   help="interleaved rounds (plain, ampkit, ..., then reversed): median and spread per runner "
                        "(5 GPU, 1 CPU)")
    p.add_argument("--seed", type=int, default=0, help="seeds the model's initial weights and the synthetic batches")
    add_device_arg(p)
    p.add_argument("--json", action="store_true", help="print the result object as JSON on stdout (nothing else)")
    p.add_argument("--out", default=None, metavar="FILE", help="also write the JSON result to FILE")
    p.set_defaults(func=run)
    return p


def _split(values: list[str] | None) -> tuple[str, ...] | None:
    if not values:
        return None
    return tuple(v.strip().lower() for item in values for v in item.split(",") if v.strip())


def run(args) -> int:
    if args.out:
        check_writable(args.out, "--out")  # before torch loads and minutes of measuring, not after
    from ampkit.bench import BenchConfig, run_bench
    from ampkit.tasks import parse_task_args

    config = BenchConfig(
        model=args.model, task_options=parse_task_args(args.task_arg), precisions=_split(args.precision),
        eager=not args.no_eager, compile=args.compile, compile_mode=args.compile_mode, graph=args.graph,
        runners=_split([args.runners] if args.runners else None), steps=args.steps, warmup=args.warmup,
        rounds=args.rounds, fp8_recipe=tuple(args.fp8_recipe), fp8_layers=args.fp8_layers,
        device=args.device, seed=args.seed, command="ampkit bench " + " ".join(shlex.quote(a) for a in sys.argv[2:])
        if len(sys.argv) > 1 and sys.argv[1] == "bench" else None,
    )
    config.validate()
    with exit_promptly("bench"):  # Ctrl-C within seconds, even inside one long step on the CPU
        result = run_bench(config, progress=_Progress())
    if args.out:
        from ampkit.cli.output import write_json_file

        write_json_file(args.out, result, "--out", "bench")  # a full disk: one line, and the result kept
    if args.json:
        print_json(result)
    else:
        render(result)
    if not any(r["status"] == "ok" for r in result["rows"]):
        why = "; ".join(sorted({f"{r['runner']} {r['status']}: {_short(r['message'], 120)}" for r in result["rows"]}))
        err_console().print(f"ampkit bench: error: nothing was measured ({why or 'no runner applies'}): pick other "
                            f"--runners or --precision", highlight=False, soft_wrap=True)
        return 1
    return 0


class _Progress:
    """One line per runner on stderr (stdout stays clean for --json)."""

    def __init__(self) -> None:
        self.err = err_console()

    def __call__(self, ev: dict) -> None:
        kind = ev.get("event")
        if kind == "fp8_trial":
            line = fp8_trial_line(ev)
            if line:
                self.err.print(line, highlight=False, soft_wrap=True)
        elif kind == "start":
            self.err.print(f"[bold]bench {ev['model']}[/] on {ev['device']} ({ev['name']})", highlight=False)
        elif kind == "peak":
            from ampkit.training.speed import fmt_rate  # lazily: the CLI starts without torch

            self.err.print(f"matmul rate: {fmt_rate(ev['tflops'])} TFLOP/s ({ev['dtype']}, {ev['shape'][0]}^3)",
                           highlight=False)
        elif kind == "runner":
            mode = "compiled" if ev["compiled"] else "eager"
            self.err.print(f"[{ev['index'] + 1}/{ev['total']}] {ev['precision']} {mode} {ev['runner']}"
                           + (f" round {ev['round'] + 1}" if ev.get("round") else ""), highlight=False, end="")
        elif kind == "round":
            r = ev["row"]
            if r["status"] != "ok":
                self.err.print(f": {r['status']}: {_short(r['message'], 200)}", highlight=False)
                return
            bits = [f"{r['ms_per_step']:.3f} ms/step"]
            if r["mfu"] is not None:
                bits.append(f"MFU {r['mfu']:.1%}")
            if r["ratio_to_plain"] is not None:
                bits.append(f"x plain {r['ratio_to_plain']:.3f}")
            if r["peak_mem_bytes"] is not None:
                bits.append(f"peak {r['peak_mem_bytes'] / 2**30:.2f} GiB")
            if r["host_syncs_per_step"] is not None:
                bits.append(f"syncs/step {r['host_syncs_per_step']:g}")
            if r.get("graph_captured") is not None:
                bits.append("captured" if r["graph_captured"] else f"eager: {r.get('graph_fallback')}")
            bits.append(f"warm-up {r['warmup_s']:.1f} s")
            self.err.print(": " + ", ".join(bits), highlight=False)
        elif kind == "row" and ev["row"].get("ratio_verdict") and ev["row"]["status"] == "ok":
            r = ev["row"]
            self.err.print(f"  {r['precision']} {r['runner']} over plain: median {r['ratio_to_plain']:.3f}: "
                           f"{r['ratio_verdict']}", highlight=False)


def _fmt(v, spec: str, scale: float = 1.0, suffix: str = "") -> str:
    return "-" if v is None else f"{v * scale:{spec}}{suffix}"


def _span(pair, spec: str) -> str:
    return "-" if not pair or pair[0] == pair[1] else f"{pair[0]:{spec}}-{pair[1]:{spec}}"


def _state(bar: dict) -> str:
    """A bar's outcome: pass, miss, or within noise with the rounds' spread (neither: a noisy machine's rounds)."""
    if bar.get("state") == "within noise":
        spread = bar.get("spread")
        return "[yellow]within noise[/]" + (f" ({spread[0]:.3f}-{spread[1]:.3f})" if spread else "")
    return "[green]pass[/]" if bar["pass"] else "[red]miss[/]"


def _short(text: str | None, n: int = 60) -> str:
    text = text or ""
    return text if len(text) <= n else text[: n - 1] + "…"


def render(result: dict) -> None:
    """Rich tables: one per configuration, then the bars and the notes."""
    from rich.table import Table

    out = console()
    if not out.is_terminal:  # a log file or a pipe: wide enough that the tables do not wrap
        from rich.console import Console

        out = Console(width=max(out.width, 150))
    dev, peak, model = result["device"], result["peak"], result["model"]
    out.print(f"[bold]{model['name']}[/] on {dev['name']} ({dev['type']}), torch {result['versions'].get('torch')}: "
              f"{model['description']}", highlight=False)
    settings = result["settings"]
    from ampkit.training.speed import fmt_rate  # lazily: the CLI starts without torch

    out.print(f"matmul rate {fmt_rate(peak['tflops'])} TFLOP/s ({peak['dtype']}), {settings['steps']} timed steps "
              f"after {settings['warmup']} warm-up, {settings.get('rounds', 1)} interleaved round(s): "
              "medians, spread min-max", highlight=False)
    per_tokens = model.get("tokens_per_step") is not None
    configs: dict[tuple, list[dict]] = {}
    for r in result["rows"]:
        configs.setdefault((r["precision"], r["compiled"]), []).append(r)
    for (prec, compiled), rows in configs.items():
        t = Table(title=f"{prec} {'compiled' if compiled else 'eager'}", title_justify="left")
        for col in ("runner", "ms/step", "spread", "tokens/s" if per_tokens else "samples/s", "MFU", "peak mem",
                    "x plain", "x spread", "syncs/step", "loss", "note"):
            t.add_column(col, justify="left" if col in ("runner", "note") else "right")
        for r in rows:
            rate = r["tokens_per_s"] if per_tokens else r["samples_per_s"]
            note = "" if r["status"] == "ok" else f"{r['status']}: {_short(r['message'])}"
            if r.get("graph_captured") is False:
                note = f"eager: {_short(r.get('graph_fallback'))}"
            elif r.get("graph_captured"):
                note = "one graph per step"
            if (r.get("ratio_verdict") or "").startswith("within noise"):
                note = (note + "; " if note else "") + "overhead within noise"
            t.add_row(r["runner"], _fmt(r["ms_per_step"], ".3f"), _span(r.get("ms_spread"), ".3f"), _fmt(rate, ",.0f"),
                      _fmt(r["mfu"], ".1%"), _fmt(r["peak_mem_bytes"], ".2f", 1 / 2**30, " GiB"),
                      _fmt(r["ratio_to_plain"], ".3f"), _span(r.get("ratio_spread"), ".3f"),
                      _fmt(r["host_syncs_per_step"], ".2g"), _fmt(r["loss_last"], ".4f"), note)
        out.print(t)
    if result["bars"]:
        t = Table(title="bars", title_justify="left")
        for col in ("bar", "target", "measured", "", "detail"):
            t.add_column(col)
        for b in result["bars"]:
            t.add_row(b["name"], b["bar"], _fmt(b["value"], ".3f"), _state(b), b["detail"])
        out.print(t)
    for note in result["notes"]:
        out.print(f"note: {note}", highlight=False)
