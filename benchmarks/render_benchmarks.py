"""Render BENCHMARKS.md from the result files in benchmarks/results/*.json.

    python benchmarks/render_benchmarks.py            # rewrite BENCHMARKS.md
    python benchmarks/render_benchmarks.py --check    # exit 1 if BENCHMARKS.md is not what the results give
    python benchmarks/render_benchmarks.py --stamp benchmarks/results/NEW.json   # record the git commit in it

One current table per workload: for every row (precision, mode, runner) the newest file that measured
it, with that file's commit, date, card, torch version and command. The dated lab notebook of the
first runs is benchmarks/results/HISTORY.md; it is not generated.

Every result file must carry ``git_commit``: ``--stamp`` writes ``git rev-parse HEAD`` (with
``-dirty`` when the working tree has changes) into files that lack it. Files recorded before the field
existed say ``"unknown (before 2026-12-01)"``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
OUTPUT = ROOT / "BENCHMARKS.md"

RUNNERS = ("plain", "ampkit", "ampkit-graph", "lesson", "accelerate", "fabric")
RUNNER_NAMES = {"plain": "hand-written loop", "ampkit": "ampkit", "ampkit-graph": "ampkit whole-step graph",
                "lesson": "the lesson's loop", "accelerate": "Accelerate", "fabric": "Lightning Fabric"}
PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "fp8")


class ResultError(ValueError):
    """A result file that cannot be rendered; the message names the file and what to do."""


# ---------------------------------------------------------------------------------------------- loading
def kind_of(data: dict) -> str:
    if "rows" in data and "model" in data:
        return "bench"
    if "verdict" in data and "curves" in data:
        return "compare"
    if "recommended" in data and "dtypes" in data:
        return "doctor"
    if "throughput_samples_per_s" in data:
        return "distributed"
    if "benchmark" in data and isinstance(data.get("results"), list) and "summary" in data:
        return "rounds"  # a script under benchmarks/ that measures configurations in rounds (e.g. fp8_h200.py)
    if data.get("kind") == "digits-sizes" and isinstance(data.get("configs"), dict):
        return "sizes"  # benchmarks/digits_sizes.py: the main job at several model sizes
    if data.get("kind") == "verdict-calibration" and isinstance(data.get("tasks"), dict):
        return "calibration"  # benchmarks/verdict_calibration.py: how often the compare verdict is wrong
    if data.get("kind") == "sequential-verdict-calibration" and isinstance(data.get("real"), dict):
        return "sequential"  # benchmarks/sequential_calibration.py: compare --seeds auto against fixed seeds
    if data.get("kind") == "fp8-decision" and isinstance(data.get("decision"), dict):
        return "fp8-decision"  # benchmarks/fp8_decision_h200.py: the measured FP8 decision on one model

    if data.get("kind") == "bf16-weights-cpu" and isinstance(data.get("stored"), dict):
        return "bf16-weights-cpu"  # benchmarks/bf16_weights.py: bytes stored per parameter, compare verdicts
    if data.get("kind") == "bf16-weights-gpu" and isinstance(data.get("runs"), list):
        return "bf16-weights"  # benchmarks/bf16_weights_h200.py: memory and step time of the ways to store weights
    if data.get("kind") == "parity" and isinstance(data.get("runs"), list):
        return "parity"  # ampkit parity on the GPU against the CPU (benchmarks/parity_scripts)
    if data.get("kind") == "migrate-speed" and isinstance(data.get("runs"), list):
        return "migrate"  # benchmarks/migrate_speed.py: CPU time of `ampkit migrate` against ast.parse
    if data.get("kind") == "judges" and isinstance(data.get("summary"), dict):
        return "judges"  # benchmarks/judges.py: diagnose and migrate against the corpus's truth tables
    if data.get("kind") == "mutation" and isinstance(data.get("packages"), dict):
        return "mutation"  # benchmarks/mutation.py: the share of mutants the fast tests kill, per package
    raise ResultError("unknown kind of result (expected ampkit bench --json, compare.json, doctor --json, "
                      "the distributed summary, benchmarks/digits_sizes.py's, migrate_speed.py's or mutation.py's)")


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def load_results(folder: Path = RESULTS) -> list[dict]:
    """Every result file, with ``_file`` and ``_kind`` added."""
    out = []
    for path in sorted(folder.glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(data, dict):
                raise ResultError("not a JSON object")
            if not data.get("git_commit") and (data.get("versions") or {}).get("git_commit"):
                data["git_commit"] = data["versions"]["git_commit"]  # `ampkit bench --json` records it there
            if not data.get("git_commit"):
                raise ResultError("no git_commit: record it with "
                                  f"`python benchmarks/render_benchmarks.py --stamp {_rel(path)}`")
            data["_kind"] = kind_of(data)
        except (json.JSONDecodeError, ResultError) as exc:
            raise ResultError(f"{_rel(path)}: {exc}") from None
        data["_file"] = path.name
        out.append(data)
    return out


def _date(data: dict) -> str:
    return str(data.get("date") or "not recorded")


def _card(data: dict) -> str:
    device = data.get("device")
    if isinstance(device, dict) and device.get("name"):
        return device["name"]
    return data.get("card") or data.get("machine") or "not recorded"


def _torch(data: dict) -> str:
    return (data.get("versions") or {}).get("torch") or data.get("torch") or "not recorded"


def _commit(data: dict) -> str:
    commit = data["git_commit"]
    return f"`{commit[:12]}`" if all(c in "0123456789abcdef" for c in commit[:12]) else commit


# ---------------------------------------------------------------------------------------------- formatting
def _ms(value: float | None) -> str:
    if value is None:
        return ""
    if value < 1:
        return f"{value * 1000:.0f} us"
    return f"{value:.1f}" if value >= 100 else f"{value:.2f}"


def _rate(value: float | None) -> str:
    return "" if value is None else f"{value:,.0f}"


def _pct(value: float | None) -> str:
    return "" if value is None or value < 1e-4 else f"{value * 100:.1f} %"


def _mib(value: int | None) -> str:
    return "" if value is None else f"{value / 2**20:,.1f}"


def _signed_bytes(value: int | None) -> str:
    return "" if value is None else ("0" if value == 0 else f"{value:+,d}")


def _ratio(value: float | None, digits: int = 3) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def _cell(text: object) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


class Sources:
    """The files a table draws on, each with a letter for the `source` column."""

    def __init__(self) -> None:
        self.files: dict[str, tuple[str, dict]] = {}

    def ref(self, data: dict) -> str:
        name = data["_file"]
        if name not in self.files:
            self.files[name] = ("abcdefghijklmnopqrstuvwxyz"[len(self.files)], data)
        return self.files[name][0]

    def render(self, method) -> list[str]:
        lines = ["| source | file | commit | date | card | torch | method |", "|---|---|---|---|---|---|---|"]
        for name, (letter, data) in self.files.items():
            lines.append(f"| {letter} | `{name}` | {_commit(data)} | {_date(data)} | {_cell(_card(data))} | "
                         f"{_torch(data)} | {_cell(method(data))} |")
        return lines


# ---------------------------------------------------------------------------------------------- bench
def _bench_method(data: dict) -> str:
    s = data.get("settings", {})
    peak = data.get("peak") or {}
    rate = f"; matmul rate {peak['tflops']:.1f} TFLOP/s (MFU denominator)" if peak.get("tflops") else ""
    return f"`{data.get('command', '')}`: {s.get('steps')} timed steps after {s.get('warmup')} warm-up{rate}"


def _row_key(row: dict) -> tuple:
    return (row["precision"], bool(row["compiled"]), row["runner"])


def _sort_key(key: tuple) -> tuple:
    precision, compiled, runner = key
    return (PRECISIONS.index(precision) if precision in PRECISIONS else 99, compiled,
            RUNNERS.index(runner) if runner in RUNNERS else 99, runner)


def bench_section(model: str, files: list[dict]) -> list[str]:
    newest: dict[tuple, tuple[dict, dict]] = {}
    for data in sorted(files, key=lambda d: _date(d)):
        for row in data["rows"]:
            newest[_row_key(row)] = (data, row)
    first = files[-1]["model"]
    tokens = any(row.get("tokens_per_s") for _, row in newest.values())
    lesson = any(key[2] == "lesson" for key in newest)
    sources = Sources()
    header = ["precision", "mode", "runner", "ms/step", "tokens/s" if tokens else "samples/s", "MFU",
              "peak MiB", "peak - plain (bytes)", "x plain", "syncs/step"]
    if lesson:
        header.append("lesson's loop / this")
    header.append("source")
    lines = [f"## {model}", "", _cell(first.get("description", "")), ""]
    if first.get("n_params"):
        lines[-1:] = [f"{first['n_params']:,} parameters"
                      + (f", {first['flops_per_step'] / 1e12:.2f} TFLOP a step" if first.get("flops_per_step", 0) > 1e9
                         else "") + ".", ""]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for key in sorted(newest, key=_sort_key):
        data, row = newest[key]
        letter = sources.ref(data)
        mode = "compiled" if row["compiled"] else "eager"
        if row["status"] != "ok":
            message = f"{row['status']}: {row.get('message') or ''}"
            lines.append(f"| {row['precision']} | {mode} | {RUNNER_NAMES.get(row['runner'], row['runner'])} | "
                         f"{_cell(message)} |" + " |" * (len(header) - 5) + f" {letter} |")
            continue
        same = {r["runner"]: r for r in data["rows"] if r["precision"] == row["precision"]
                and r["compiled"] == row["compiled"] and r["status"] == "ok"}
        plain, lesson_row = same.get("plain"), same.get("lesson")
        peak_vs = (row["peak_mem_bytes"] - plain["peak_mem_bytes"]
                   if plain and row.get("peak_mem_bytes") is not None and plain.get("peak_mem_bytes") is not None
                   else None)
        ms = _ms(row["ms_per_step"])
        if row.get("ms_spread") and len(row.get("ms_rounds") or []) > 1:
            ms += f" ({_ms(row['ms_spread'][0])}-{_ms(row['ms_spread'][1])}, {len(row['ms_rounds'])} rounds)"
        ratio = _ratio(row.get("ratio_to_plain"))
        if row.get("ratio_spread") and row["runner"] != "plain":
            ratio += f" ({_ratio(row['ratio_spread'][0])}-{_ratio(row['ratio_spread'][1])})"
        cells = [row["precision"], mode, RUNNER_NAMES.get(row["runner"], row["runner"]), ms,
                 _rate(row.get("tokens_per_s") if tokens else row.get("samples_per_s")), _pct(row.get("mfu")),
                 _mib(row.get("peak_mem_bytes")), _signed_bytes(peak_vs), ratio,
                 "" if row.get("host_syncs_per_step") is None else f"{row['host_syncs_per_step']:g}"]
        if lesson:
            cells.append(f"{lesson_row['ms_per_step'] / row['ms_per_step']:.1f}x"
                         if lesson_row and row.get("ms_per_step") else "")
        cells.append(letter)
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Bars judged in these runs (the newest value of each):", "",
              "| bar | target | value | pass | detail | source |", "|---|---|---|---|---|---|"]
    bars: dict[str, tuple[dict, dict]] = {}
    for data in sorted(files, key=lambda d: _date(d)):
        for bar in data.get("bars", []):
            bars[bar["name"]] = (data, bar)
    for name, (data, bar) in bars.items():
        value = bar.get("value")
        shown = "" if value is None else (f"{value:.4g}" if isinstance(value, float) else str(value))
        verdict = {True: "pass", False: "**miss**", None: "not judged"}.get(bar.get("pass"), str(bar.get("pass")))
        if bar.get("state") == "within noise":  # a noisy machine's rounds: neither pass nor miss (issue 45)
            verdict = "within noise" + (f" ({bar['spread'][0]:.3f}-{bar['spread'][1]:.3f})" if bar.get("spread") else "")
        lines.append(f"| {_cell(name)} | {_cell(bar.get('bar', ''))} | {shown} | {verdict} | "
                     f"{_cell(bar.get('detail', ''))} | {sources.ref(data)} |")
    lines += [""] + sources.render(_bench_method)
    return lines


# ---------------------------------------------------------------------------------------------- others
def _model(data: dict) -> str:
    """The model part of a compare file's task description ("large CNN (...)"), which tells sizes apart."""
    desc = data.get("task_description") or ""
    parts = desc.split("), ", 1)
    model = parts[1] if len(parts) == 2 else desc
    return model.split(", cross-entropy")[0].split("; metric")[0].strip()


def compare_section(files: list[dict]) -> list[str]:
    newest: dict[tuple, dict] = {}
    for data in sorted(files, key=lambda d: _date(d)):
        newest[(data["task"], _model(data), data["precision"], _card(data))] = data
    sources = Sources()
    lines = ["## FP32 vs AMP (`ampkit compare`)", "",
             "Speed-up: AMP samples/s over FP32's, both with the whole step as one device graph where it was "
             "captured; eager: the same with eager steps (short runs beside the graphed ones).", "",
             "| task | model | precision | verdict | final metric: FP32 mean / AMP mean (allowed) | skipped AMP steps | "
             "matmul FLOPs in low precision | speed-up | eager | memory saving | source |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for key in sorted(newest, key=lambda k: (k[0], k[1], PRECISIONS.index(k[2]) if k[2] in PRECISIONS else 99)):
        d = newest[key]
        fm = d.get("final_metric") or {}
        allowed = fm.get("allowed")
        low = allowed[0] if isinstance(allowed, list) else allowed
        metric = (f"{fm.get('name')}: {fm['fp32_mean']:.4f} / {fm['amp_mean']:.4f} (>= {low:.4f})"
                  if fm.get("fp32_mean") is not None and low is not None else "")
        skipped = d.get("skipped") or {}
        amp_skipped = sum((skipped.get("amp") or {}).values())
        runs = len(d.get("seeds", [])) * int(skipped.get("steps") or d.get("steps") or 0)
        ratios = d.get("ratios") or {}
        audit = d.get("audit") or {}
        graphed = ratios.get("step_graph")
        eager = ratios.get("speedup_eager") if graphed else ratios.get("speedup")
        speedup = _ratio(ratios.get("speedup"), 2) if graphed else "-"
        lines.append(f"| {d['task']} | {_cell(_model(d))} | {d['precision']} | **{d['verdict'].upper()}** | {metric} | "
                     f"{amp_skipped} of {runs} | {_pct(audit.get('matmul_share'))} | "
                     f"{speedup} | {_ratio(eager, 2)} | {_pct(ratios.get('memory_saving'))} | "
                     f"{sources.ref(d)} |")
    lines += [""] + sources.render(lambda d: f"`ampkit compare --precision {d['precision']}` on {d['task']}: "
                                             f"seeds {d.get('seeds')}, {d.get('steps')} steps each")
    return lines


def fp8_decision_section(files: list[dict]) -> list[str]:
    """benchmarks/fp8_decision_h200.py: the measured FP8 decision per model against BF16 and FP8-eligible."""
    lines = ["## The FP8 decision measured on the model (`benchmarks/fp8_decision_h200.py`)", "",
             "`--precision fp8` times a few layer sets on the model itself (compiled here) and keeps the fastest only "
             "if it beats BF16 beyond the rounds' spread and by >= 3 %. `decision cost`: the trial, compiles "
             "included (paid once, then cached). Step times: median of 5 interleaved confirmation rounds on the "
             "trial's own compiled steps (spread max-min); `vs best`: the decision's time over the faster of BF16 "
             "and FP8 on every eligible layer.", "",
             "| model | tried (trial medians, ms) | decision | ms/step | BF16 | FP8-eligible | vs best | "
             "decision cost | commit | file |", "|---|---|---|---|---|---|---|---|---|---|"]
    for d in sorted(files, key=lambda d: d["model"]):
        conf = d["confirm"]
        tried = ", ".join(f"{r['name']} {r['ms_median']:.1f}" for r in d["decision"]["rows"])

        def ms(name: str | None) -> str:
            if name is None or name not in conf["ms_median"]:
                return "-"
            return f"{conf['ms_median'][name]:.2f} (+-{conf['ms_spread'][name] / 2:.2f})"
        winner = d["decision"]["winner"]
        lines.append(f"| {_cell(d['description'])} | {tried} | {winner} | {ms(winner)} | {ms('bf16')} | "
                     f"{ms('fp8-eligible')} | {d['decision_over_best']:.3f} | {d['decision_s']:.0f} s | "
                     f"`{str(d.get('git_commit'))[:10]}` | {d['_file']} |")
    if files:
        d = files[0]
        lines += ["", f"{d['device']}, torch {d['versions'].get('torch')}, torchao {d['versions'].get('torchao')}, "
                      f"transformers {d['versions'].get('transformers')}, timm {d['versions'].get('timm')}; "
                      "FP8 tensorwise; random weights and data; fused AdamW."]
    return lines


def migrate_section(files: list[dict]) -> list[str]:
    """benchmarks/migrate_speed.py: `ampkit migrate` CPU time as a multiple of `ast.parse` (median, min-max)."""
    lines = ["## `ampkit migrate` speed (`benchmarks/migrate_speed.py`)", "",
             "CPU time (one process) of migrate over a whole folder, and of the 15 files densest in AMP code, as a "
             "multiple of `ast.parse` of the same files: median (min-max) over the runs.", "",
             "| run | commit | target | files / lines | folder CPU s | folder vs ast.parse | AMP-dense vs ast.parse | "
             "runs | file |", "|---|---|---|---|---|---|---|---|---|"]

    def spread(stats: dict, unit: str = "x", digits: int = 1) -> str:
        return f"{stats['median']:.{digits}f}{unit} ({stats['min']:.{digits}f}-{stats['max']:.{digits}f})"

    for data in files:
        for run in data["runs"]:
            rep, dense = run["repository"], run["dense"]
            lines.append(f"| {_cell(run.get('label'))} | `{run.get('commit')}` | {run.get('target')} | "
                         f"{rep['files']} / {rep['lines']:,} | {spread(rep['migrate_cpu_s'], ' s')} | "
                         f"{spread(rep['ratio'])} | {spread(dense['ratio'])} | {run.get('repeats')} | {data['_file']} |")
    return lines


def judges_section(files: list[dict]) -> list[str]:
    """benchmarks/judges.py: the newest full run (else the newest run) of diagnose and migrate on the corpus."""
    full = [d for d in files if d.get("subset") == "full"] or files
    data = max(full, key=lambda d: (str(d.get("date")), d["_file"]))
    src = f"{data['_file']}, {_commit(data)}, {_date(data)}, torch {_torch(data)}"
    lines = ["## Judges on code nobody here wrote (`benchmarks/judges.py`)", "",
             "`ampkit diagnose` and `ampkit migrate` over `tests/judges/corpus/`: scripts and files modelled on public "
             "repositories, each with a truth table (`cases.json`; docs/contributing.md says how to add a case). "
             f"Newest {data.get('subset', 'full')} run: {src}.", ""]
    d, held = data["summary"].get("diagnose"), data["summary"].get("diagnose_held_out")
    if d:
        lines += ["| diagnose | clean cases | clean with a finding | false findings | planted defects | right code | "
                  "right line | wrong code | missed | extra findings on planted |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        # every full run's held-out row: the first scoring stays visible after code is changed for those cases
        helds = [(f"held out ({r['_file']}), ", r["summary"]["diagnose_held_out"]) for r in sorted(full, key=lambda r: r["_file"])
                 if r is not data and r.get("subset") == "full" and r["summary"].get("diagnose_held_out")]
        for label, s in (("", d), *helds, (f"held out ({data['_file']}), ", held)):
            if s:
                lines.append(f"| {label}{s['seconds']:.0f} s | {s['clean_cases']} | {s['clean_with_findings']} | "
                             f"{s['false_findings']} | {s['planted_defects']} | {s['right_code']} | {s['right_line']} | "
                             f"{s['wrong_code']} | {s['missed']} | {s['extra_findings_on_planted']} |")
        if held:
            lines += ["", "Held out: cases written after the code they judge was finished, scored before any change "
                      "for them (marked `held_out` in cases.json), counted apart; a case that code was changed for "
                      "leaves the held-out set (`was_held_out`), so earlier runs keep its first score."]
        lines += ["", "| case | expected | found |", "|---|---|---|"]
        for case in data["diagnose"]:
            found = ", ".join(f"{f['code']}:{f['line']}" for f in case["score"]["found"]) or "nothing"
            if case["kind"] == "planted" or case["score"]["found"] or case.get("held_out"):
                want = ", ".join(f"{e['code']}:{e['line']}" for e in case["expect"]) or "nothing (clean)"
                name = case["name"] + (" (held out)" if case.get("held_out") else "")
                lines.append(f"| {name} | {want} | {_cell(found)} |")
        lines.append("")
    m = data["summary"].get("migrate")
    if m:
        lines += ["| migrate --target | files | lines judged | right | reported, not ported | wrong | missed | "
                  "unexpected changes |", "|---|---|---|---|---|---|---|---|"]
        for target, c in sorted(m.items()):
            lines.append(f"| {target} | {c['files']} | {c['lines']} | {c['right']} | {c['reported']} | {c['wrong']} | "
                         f"{c['missed']} | {c['unexpected_changes']} |")
    return lines


def bf16_weights_section(files: list[dict]) -> list[str]:
    """benchmarks/bf16_weights_h200.py: the ways to store a BF16 run's weights, memory and step time."""
    lines = ["## BF16 weights with exact updates (`benchmarks/bf16_weights_h200.py`)", "",
             "Hugging Face `LlamaForCausalLM` (random weights), eager, fused AdamW, against a hand-written loop with "
             "FP32 weights under BF16 autocast. `held` is what stays allocated after a step (weights, remainders, "
             "optimizer states); `peak` includes the forward and backward.", "",
             "| file | shape | mode | step ms (min-max) | vs hand loop | peak GiB | held GiB |", "|---|---|---|---|---|---|---|"]
    for data in sorted(files, key=lambda d: d["_file"]):
        hand = {r["shape"]: r for r in data["runs"] if r.get("mode") == "hand" and "error" not in r}
        for r in data["runs"]:
            if "error" in r:
                lines.append(f"| {data['_file']} | {r['shape']} | {r['mode']} | {r['error'][:60]} | | | |")
                continue
            ref = hand.get(r["shape"])
            ratio = f"{r['step_ms_median'] / ref['step_ms_median']:.3f}" if ref else "-"
            lines.append(f"| {data['_file']} | {r['shape']} ({r['parameters'] / 1e9:.2f}B) | {r['mode']} | "
                         f"{r['step_ms_median']:.1f} ({r['step_ms_min']:.1f}-{r['step_ms_max']:.1f}) | {ratio} | "
                         f"{r['peak_gib']:.2f} | {r['held_after_step_gib']:.2f} |")
        lines += ["", f"{data['_file']}: {data.get('card')}, torch {data.get('torch')}, {_commit(data)}, {_date(data)}; "
                  f"split/join exact on the device: {data.get('split_join_exact_on_device')}.", ""]
    return lines


def bf16_weights_cpu_section(files: list[dict]) -> list[str]:
    """benchmarks/bf16_weights.py: bytes per parameter counted on live tensors, and compare's verdicts on charlm."""
    data = max(files, key=lambda d: (str(d.get("date")), d["_file"]))
    lines = ["## BF16 weights on the CPU: bytes per parameter and the verdict (`benchmarks/bf16_weights.py`)", "",
             "Bytes stored per parameter between steps (charlm's model, AdamW), counted on the live tensors:", "",
             "| weights | weight | remainder | gradient | optimizer states | total |", "|---|---|---|---|---|---|"]
    for mode, r in data["stored"].items():
        b = r["bytes_per_parameter"]
        lines.append(f"| `{mode}` | {b['weight']:g} | {b['remainder']:g} | {b['gradient']:g} | {b['states']:g} | "
                     f"{r['total_per_parameter']:g} |")
    lines += ["", "| command | verdict | reasons |", "|---|---|---|"]
    for c in data.get("compare", []):
        reasons = "; ".join(c.get("reasons") or []) or "-"
        lines.append(f"| `{c['command']}` | **{str(c.get('verdict')).upper()}** | {_cell(reasons)} |")
    lines += ["", f"{data['_file']}, {_commit(data)}, {_date(data)}, torch {_torch(data)}.", ""]
    return lines


def parity_section(files: list[dict]) -> list[str]:
    """ampkit parity on an accelerator against the CPU."""
    lines = ["## `ampkit parity` on the GPU against the CPU", "",
             "| file | command | ops compared | ops off | worst (of its bound) | seconds (replaying) |",
             "|---|---|---|---|---|---|"]
    for data in sorted(files, key=lambda d: d["_file"]):
        for r in data["runs"]:
            lines.append(f"| {data['_file']} | `{r.get('command', r['script'])}` | {r['ops_checked']} | {r['off']} | "
                         f"{r['worst_ratio']:.2f} | {r['seconds']:.1f} ({r['replay_seconds']:.1f}) |")
        lines += ["", f"{data.get('card')}, torch {data.get('torch')}, {_commit(data)}, {_date(data)}. "
                  f"{data.get('note', '')}", ""]
    return lines


def mutation_section(files: list[dict]) -> list[str]:
    """benchmarks/mutation.py: the mutants the fast test suite kills, per package, and the survivors."""
    lines = ["## Mutation testing (`benchmarks/mutation.py`)", "",
             "Each mutant is one realistic break of the code (or, with `--auto`, one operator or constant changed); "
             "killed when the fast tests that claim the behaviour fail. The mutants: `benchmarks/mutants.py`.", "",
             "| file | commit | mode | package | killed / mutants | kill rate |", "|---|---|---|---|---|---|"]
    files = sorted(files, key=lambda d: d["_file"])
    for data in files:
        rows = [*data["packages"].items(), ("**all**", {**data["total"], "timeouts": 0})]
        for name, p in rows:
            rate = p["kill_rate"]
            lines.append(f"| {data['_file']} | `{str(data.get('git_commit'))[:10]}` | {data.get('mode')} | {name} | "
                         f"{p['killed'] + p.get('timeouts', 0)} / {p['mutants']} | "
                         f"{'-' if rate is None else f'{rate:.0%}'} |")
    lines.append("")
    for data in files:
        survivors = ", ".join(f"`{r['id']}`" for r in data.get("survivors", [])) or "none"
        lines.append(f"- survivors in {data['_file']}: {survivors}")
    return lines


def sizes_section(files: list[dict]) -> list[str]:
    """benchmarks/digits_sizes.py: the README's main job (`ampkit compare`, digits) at several model sizes."""
    sources = Sources()
    lines = ["## The main job at several model sizes (`benchmarks/digits_sizes.py`)", "",
             "`ampkit compare` on digits, each configuration one CLI command; on an accelerator the default is the "
             "large model. Samples/s: the median over the seeds.", "",
             "| command | model | precision | verdict | FP32 samples/s | AMP samples/s | speed-up | eager | source |",
             "|---|---|---|---|---|---|---|---|---|"]
    for data in sorted(files, key=lambda d: _date(d)):
        ref = sources.ref(data)
        for row in data["configs"].values():
            if row.get("verdict") is None:
                lines.append(f"| `{row['command']}` | | | error (exit {row.get('exit')}) | | | | | {ref} |")
                continue
            sps = {side: _median(list(v.values())) if v else None for side, v in (row.get("samples_per_s") or {}).items()}
            graphed = row.get("step_graph")
            eager = row.get("speedup_eager") if graphed else row.get("speedup")
            model = _model({"task_description": row.get("task") or ""})
            lines.append(f"| `{row['command']}` | {_cell(model)} | {row.get('precision')} | "
                         f"**{str(row['verdict']).upper()}** | {_rate(sps.get('fp32'))} | {_rate(sps.get('amp'))} | "
                         f"{_ratio(row.get('speedup'), 2) if graphed else '-'} | {_ratio(eager, 2)} | {ref} |")
    lines += [""] + sources.render(lambda d: "`OUT=... python benchmarks/digits_sizes.py`: 3 seeds, 300 steps per run")
    return lines


def _median(values: list[float]) -> float:
    v = sorted(values)
    return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


def rounds_section(name: str, files: list[dict]) -> list[str]:
    """A benchmark script's configurations measured in rounds: median step time and the rounds' spread."""
    d = sorted(files, key=lambda d: _date(d))[-1]
    sources = Sources()
    letter = sources.ref(d)
    lines = [f"## {name}", ""]
    by_shape: dict[str, dict[str, list[dict]]] = {}
    for r in d["results"]:
        by_shape.setdefault(r["shape"], {}).setdefault(r["config"], []).append(r)
    for shape, configs in by_shape.items():
        summary = d["summary"].get(shape, {})
        shape_desc = d.get("shapes", {}).get(shape)
        lines += [f"### {shape}", ""]
        if shape_desc:
            lines += [_cell(", ".join(f"{k} {v}" for k, v in shape_desc.items())) + ".", ""]
        lines += ["| config | ms/step (median) | rounds' ms/step | tokens/s (median) | peak GiB | speed-up vs bf16 (rounds) | "
                  "final loss | source |", "|---|---|---|---|---|---|---|---|"]
        for config, rows in configs.items():
            times = sorted(r["ms_per_step"] for r in rows)
            s = summary.get(config, {}) if isinstance(summary.get(config), dict) else {}
            speed = (f"{s['speedup_vs_bf16']:.3f} ({', '.join(f'{x:.3f}' for x in s.get('speedups_per_round', []))})"
                     if "speedup_vs_bf16" in s else "1 (reference)" if config == "bf16" else "")
            losses = ", ".join(format(r["final_loss"], ".4f") for r in rows)
            lines.append(f"| {config} | {_ms(_median(times))} | {', '.join(_ms(t) for t in times)} | "
                         f"{_rate(_median([r['tokens_per_s'] for r in rows]))} | "
                         f"{max(r['peak_memory_gib'] for r in rows):.2f} | {speed} | "
                         f"{losses} | {letter} |")
        lines.append("")
    if d.get("skipped"):
        lines += [f"Not measured: {_cell(d['skipped'])}", ""]
    lines += sources.render(lambda d: "; ".join(f"{k}: {v}" for k, v in (d.get("method") or {}).items()))
    return lines


def doctor_section(files: list[dict]) -> list[str]:
    sources = Sources()
    lines = ["## Device capabilities (`ampkit doctor`)", "",
             "| card | FP32 | BF16 | FP16 | TF32 | FP8 matmul | collectives | recommended | source |",
             "|---|---|---|---|---|---|---|---|---|"]

    def cell(s: dict) -> str:
        yes = {True: "yes", False: "no", None: "unknown"}[s.get("supported")]
        probe = f", probe: {s['probe']}" if s.get("probe") else ""
        return _cell(f"{yes} ({s.get('provenance')}{probe})")

    newest: dict[str, dict] = {}
    for data in sorted(files, key=lambda d: _date(d)):
        newest[_card(data)] = data
    for card, d in sorted(newest.items()):
        dt = d["dtypes"]
        lines.append(f"| {_cell(card)} | {cell(dt['fp32'])} | {cell(dt['bf16'])} | {cell(dt['fp16'])} | "
                     f"{cell(d['tf32'])} | {cell(d['fp8'])} | {cell(d['collectives'])} "
                     f"({d['collectives'].get('backend')}) | {d['recommended']['precision']} | {sources.ref(d)} |")
    lines += [""] + sources.render(lambda d: "`ampkit doctor --json`")
    return lines


def distributed_section(files: list[dict]) -> list[str]:
    lines = ["## More than one GPU (`ampkit train --nproc 2`)", ""]
    d = sorted(files, key=lambda d: _date(d))[-1]
    sources = Sources()
    letter = sources.ref(d)
    tput = d["throughput_samples_per_s"]
    mem = d.get("peak_memory_mib", {})
    scaling = d.get("scaling", {})
    lines += [_cell(d.get("model", "")) + ". " + _cell(d.get("weak_scaling", "")) + ".", "",
              "| run | samples/s | speed-up | scaling efficiency | peak MiB | source |", "|---|---|---|---|---|---|"]
    for run, value in tput.items():
        s = scaling.get(run, {})
        lines.append(f"| {run} | {value:,} | {_ratio(s.get('speedup'), 2) + 'x' if s else '-'} | "
                     f"{_pct(s.get('efficiency')) if s else '-'} | {mem.get(run, ''):,} | {letter} |")
    if d.get("provenance"):
        lines += ["", f"Provenance: {_cell(d['provenance'])}"]
    lines += [""] + sources.render(lambda d: f"`{d.get('command', '')}`")
    return lines


# ---------------------------------------------------------------------------------------------- page
def calibration_section(files: list[dict]) -> list[str]:
    """benchmarks/verdict_calibration.py: pass / fail / inconclusive of compare's verdict on real runs, planted harms."""
    sources = Sources()
    lines = ["## How often the compare verdict is wrong (`benchmarks/verdict_calibration.py`)", "",
             "Real FP32 and BF16 runs of a pool of seeds, harms planted in the AMP runs only; every subset of n seeds "
             "judged as `ampkit compare` judges it: pass / fail / inconclusive over the subsets (CPU: the verdict, "
             "not the speed, is the measurement).", "",
             "| task | harm in the AMP runs | n seeds: pass / fail / inconclusive | source |", "|---|---|---|---|"]
    for data in sorted(files, key=lambda d: _date(d)):
        ref = sources.ref(data)
        for task, t in data["tasks"].items():
            for harm, h in t["harms"].items():
                cells = "; ".join(f"{n}: {r['pass']} / {r['fail']} / {r['inconclusive']}" for n, r in h["rates"].items())
                lines.append(f"| {task} ({t['steps']} steps) | {harm} | {cells} | {ref} |")
    lines += [""] + sources.render(lambda d: "`python benchmarks/verdict_calibration.py --charlm` "
                                             f"(pool of {len(next(iter(d['tasks'].values()))['pool'])} seeds)")
    return lines


def sequential_section(files: list[dict]) -> list[str]:
    """benchmarks/sequential_calibration.py: compare --seeds auto against 3 and 5 fixed seeds."""
    sources = Sources()
    lines = ["## `compare --seeds auto` against fixed seeds (`benchmarks/sequential_calibration.py`)", "",
             "Pass / fail rates (and for auto the mean seeds used, at most 12) on simulated independent seeds and on "
             "random orders of real pools of seeds (CPU, BF16, tolerance 1 %); harms planted on the AMP loss in "
             "units of the tolerance.", "",
             "| part | case | auto: pass / fail, mean seeds | 3 seeds: pass / fail | 5 seeds: pass / fail | source |",
             "|---|---|---|---|---|---|"]

    def row(part: str, case: str, v: dict, ref: str) -> str:
        a, f3, f5 = v["auto"], v["fixed_3"], v["fixed_5"]
        return (f"| {part} | {case} | {a['pass_rate']:.3f} / {a['fail_rate']:.3f}, {a['mean_seeds']:.2f} | "
                f"{f3['pass_rate']:.3f} / {f3['fail_rate']:.3f} | {f5['pass_rate']:.3f} / {f5['fail_rate']:.3f} | {ref} |")

    for data in sorted(files, key=lambda d: _date(d)):
        ref = sources.ref(data)
        lines += [row("simulated", case, v, ref) for case, v in data.get("simulated", {}).items()]
        for task, t in data["real"].items():
            lines += [row(f"real {task} ({t['pool']} seeds)", case, v, ref) for case, v in t["conditions"].items()]
    lines += [""] + sources.render(lambda d: "`python benchmarks/sequential_calibration.py`; design crossing rate "
                                             f"{d['design']['0.05']['crossing_rate']:.4f} at 5 %")
    return lines


def render(results: list[dict] | None = None) -> str:
    results = load_results() if results is None else results
    by_kind: dict[str, list[dict]] = {}
    for data in results:
        by_kind.setdefault(data["_kind"], []).append(data)
    out = [
        "# Benchmarks",
        "",
        "<!-- Generated by `python benchmarks/render_benchmarks.py` from benchmarks/results/*.json: do not edit."
        " -->",
        "",
        "The current figures, one table per workload, generated from the result files in `benchmarks/results/`",
        "(`python benchmarks/render_benchmarks.py`; CI checks that this file is up to date). Each row comes",
        "from the newest file that measured it; the `source` column names that file, its git commit, date,",
        "card, torch version and command. `x plain`, `peak - plain` and `lesson's loop / this` compare a row",
        "with the rows of its own source file. Each configuration was measured once per file, with no repeats:",
        "differences of about 1 % between files are within run-to-run noise. What the columns mean:",
        "`docs/commands/bench.md` (the site's `ampkit bench` page). The dated history of the first runs, with",
        "the analysis of the figures that fall short, is `benchmarks/results/HISTORY.md`; the commands that",
        "reproduce every file are workloads of `benchmarks/record_gpu.sh` (`--list` names them).",
        "",
    ]
    bench = by_kind.get("bench", [])
    models: dict[str, list[dict]] = {}
    for data in bench:
        models.setdefault(data["model"]["name"], []).append(data)
    order = ["gpt2-small", "charlm", "lesson", "digits"]
    for model in sorted(models, key=lambda m: (order.index(m) if m in order else 99, m)):
        out += bench_section(model, models[model]) + [""]
    rounds: dict[str, list[dict]] = {}
    for data in by_kind.get("rounds", []):
        rounds.setdefault(data["benchmark"], []).append(data)
    for name in sorted(rounds):
        out += rounds_section(name, rounds[name]) + [""]
    if by_kind.get("compare"):
        out += compare_section(by_kind["compare"]) + [""]
    if by_kind.get("sizes"):
        out += sizes_section(by_kind["sizes"]) + [""]
    if by_kind.get("calibration"):
        out += calibration_section(by_kind["calibration"]) + [""]
    if by_kind.get("sequential"):
        out += sequential_section(by_kind["sequential"]) + [""]

    if by_kind.get("fp8-decision"):
        out += fp8_decision_section(by_kind["fp8-decision"]) + [""]
    if by_kind.get("bf16-weights"):
        out += bf16_weights_section(by_kind["bf16-weights"]) + [""]
    if by_kind.get("bf16-weights-cpu"):
        out += bf16_weights_cpu_section(by_kind["bf16-weights-cpu"]) + [""]
    if by_kind.get("parity"):
        out += parity_section(by_kind["parity"]) + [""]
    if by_kind.get("migrate"):
        out += migrate_section(by_kind["migrate"]) + [""]
    if by_kind.get("judges"):
        out += judges_section(by_kind["judges"]) + [""]
    if by_kind.get("mutation"):
        out += mutation_section(by_kind["mutation"]) + [""]
    if by_kind.get("distributed"):
        out += distributed_section(by_kind["distributed"]) + [""]
    if by_kind.get("doctor"):
        out += doctor_section(by_kind["doctor"]) + [""]
    out += ["## CPU figures", "",
            "`ampkit bench` also runs on the CPU (CI runs it to check that it works). CPU figures measure a shared",
            "2-core container, not ampkit, and none are recorded here."]
    return "\n".join(out).rstrip() + "\n"


def git_commit(root: Path = ROOT) -> str:
    """``git rev-parse HEAD``, with ``-dirty`` when tracked files have uncommitted changes."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                           capture_output=True, text=True, check=True).stdout.strip()
    return head.stdout.strip() + ("-dirty" if dirty else "")


def stamp(path: Path, commit: str) -> bool:
    """Add ``git_commit`` to one result file that lacks it (the file's other bytes unchanged)."""
    text = path.read_text(encoding="utf-8")
    data = json.loads(text)
    if data.get("git_commit"):
        return False
    if not text.startswith("{"):
        raise ResultError(f"{path}: not a JSON object")
    rest = text[1:].lstrip("\n")
    indent = rest[: len(rest) - len(rest.lstrip(" "))] or "  "
    path.write_text("{\n" + indent + json.dumps("git_commit") + ": " + json.dumps(commit)
                    + ("," if data else "") + "\n" + rest, encoding="utf-8")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Render BENCHMARKS.md from benchmarks/results/*.json.")
    parser.add_argument("--check", action="store_true", help="exit 1 if BENCHMARKS.md is out of date")
    parser.add_argument("--stamp", nargs="+", metavar="FILE", help="record the current git commit in result files")
    args = parser.parse_args(argv)
    try:
        if args.stamp:
            commit = git_commit()
            for name in args.stamp:
                changed = stamp(Path(name), commit)
                print(f"{name}: {'git_commit ' + commit if changed else 'already has a git_commit'}")
            return 0
        text = render()
    except (ResultError, OSError, subprocess.CalledProcessError, json.JSONDecodeError) as exc:
        print(f"render_benchmarks: error: {exc}", file=sys.stderr)
        return 2
    if args.check:
        if OUTPUT.read_text(encoding="utf-8") != text:
            print("BENCHMARKS.md is out of date: run `python benchmarks/render_benchmarks.py`", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUTPUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
