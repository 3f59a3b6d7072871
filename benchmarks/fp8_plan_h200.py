"""Issue 33's GPU figures: the FP8 cost probe, then bench and compare with the FP8 plan, one part per call.

    OUT=/tmp/out python benchmarks/fp8_plan_h200.py probe gpt2          # a part or several, in order
    python benchmarks/fp8_plan_h200.py --list                            # the parts, what each runs, its time

Each part runs ampkit's own CLI in a subprocess (its GPU memory freed after), under a time limit, and writes
``$OUT/<TAG>-fp8plan-<part>.json`` (``TAG``: card and date, as record_gpu.sh) plus ``steps.txt`` (exit status
and seconds per part). The cost models are cached in ``$AMPKIT_FP8_COST_CACHE`` (default
``/tmp/ampkit-fp8-cost.json``: a later call on the same warm machine reuses them); each part copies the cache
into $OUT, so the probe's figures (with their provenance) come back with every result. torchao is
installed from a carried ``.whl/`` when it is not importable. Every part fits a 10-minute call; ``probe``
first is cheapest (the other parts probe what they need themselves when it did not run).

A compare part needs more seeds than one call holds? ``SEEDS=N`` replaces its ``--seeds``, and ``KEEP=.cmp``
(a folder carried to the device and back) keeps its ``--out`` there: when that folder already holds a
``compare.json``, the part adds ``--continue``, so a later call trains only the missing seeds::

    SEEDS=5 KEEP=.cmp OUT=/tmp/out python benchmarks/fp8_plan_h200.py compare-llama   # call 1: seeds 0-4
    # copy $OUT/<name>.json back to .cmp/fp8plan-<name>/compare.json, then carry .cmp again:
    SEEDS=8 KEEP=.cmp OUT=/tmp/out python benchmarks/fp8_plan_h200.py compare-llama   # call 2: seeds 5-7
"""

from __future__ import annotations

import datetime as dt
import glob
import json
import os
import shutil
import subprocess
import sys
import time

PY = sys.executable
LLAMA = ["--model", "llama-1b", "--precision", "bf16", "fp8", "--runners", "ampkit", "--steps", "8", "--warmup", "3"]
CHARLM_BIG = ["--task", "charlm", "--task-arg", "d_model=2048", "--task-arg", "n_layers=2", "--task-arg", "n_heads=16",
              "--task-arg", "seq_len=512", "--task-arg", "batch_size=32"]
# The largest Llama shape that trains on one H200 in FP32 too (2.21B with the 32000-token head), as task arguments.
LLAMA_2B = ["--task-arg", "d_model=3072", "--task-arg", "n_layers=20", "--task-arg", "n_heads=24",
            "--task-arg", "n_kv_heads=8", "--task-arg", "ffn=8192", "--task-arg", "vocab_size=32000"]
# part: (what it records, limit in seconds, the ampkit command lines it runs: (suffix, argv))
PARTS = {
    "probe": ("the FP8 cost model, eager and compiled, of each recipe in $PROBE_RECIPES (default tensorwise), "
              "and its predictions for GPT-2-small and llama-1b (estimated 1-2 min per recipe)", 560,
              [("", ["probe"])]),
    "gpt2": ("bench gpt2-small BF16 vs FP8 tensorwise with the plan, eager and compiled, plain/ampkit, 3 rounds "
             "(estimated 6 min)", 570,
             [("", ["bench", "--model", "gpt2-small", "--precision", "bf16", "fp8", "--compile",
                    "--runners", "plain,ampkit", "--rounds", "3"])]),
    "gpt2-eligible": ("bench gpt2-small compiled, FP8 on every eligible layer (what the plan avoids), "
                      "tensorwise and rowwise (estimated 6 min)", 570,
                      [("", ["bench", "--model", "gpt2-small", "--precision", "bf16", "fp8", "--compile", "--no-eager",
                             "--fp8-layers", "eligible", "--fp8-recipe", "tensorwise", "rowwise",
                             "--runners", "ampkit", "--rounds", "3"])]),
    "llama-eager": ("bench llama-1b (1.1B, 8 x 2048 tokens) eager: BF16 vs FP8 with the plan, then every eligible "
                    "layer in FP8, 3 rounds (estimated 5 min)", 570,
                    [("plan", ["bench", *LLAMA, "--rounds", "3"]),
                     ("eligible", ["bench", *LLAMA, "--rounds", "2", "--fp8-layers", "eligible"])]),
    "llama-compiled": ("bench llama-1b compiled: BF16 vs FP8 tensorwise with the plan, 2 rounds (compiles two "
                       "1.1B models: estimated 8 min)", 590,
                       [("", ["bench", *LLAMA, "--compile", "--no-eager", "--rounds", "2"])]),
    "llama-rowwise": ("bench llama-1b compiled: FP8 rowwise and rowwise_with_gw_hp with the plan beside BF16 "
                      "(estimated 9 min)", 595,
                      [("", ["bench", *LLAMA, "--compile", "--no-eager", "--rounds", "1",
                             "--fp8-recipe", "rowwise", "rowwise_with_gw_hp"])]),
    "compare-llama": ("compare --precision fp8 --fp8-layers eligible on the llama task in the 2.21B shape "
                      "(2 x 2048 bytes a step, 50 steps, lr 1.5e-4, warmup 20 and cosine), 3 seeds, eager steps, against "
                      "FP32 (measured 106 s a seed: SEEDS=5 fits a call, then SEEDS=8 with KEEP continues)", 590,
                      [("", ["compare", "--task", "llama", *LLAMA_2B, "--task-arg", "seq_len=2048",
                             "--task-arg", "batch_size=2", "--task-arg", "corpus_bytes=4000000",
                             "--task-arg", "eval_windows=32", "--task-arg", "lr=1.5e-4", "--task-arg", "warmup=20", "--precision", "fp8",
                             "--fp8-layers", "eligible", "--seeds", "3", "--steps", "50", "--no-graph",
                             "--no-audit"])]),
    "llama-2b-eager": ("bench the 2.21B llama eager: BF16 vs FP8 with the plan, then every eligible layer in FP8, "
                       "2 rounds (estimated 5 min)", 570,
                       [("plan", ["bench", "--model", "llama-1b", *LLAMA_2B, "--precision", "bf16", "fp8",
                                  "--runners", "ampkit", "--steps", "8", "--warmup", "3", "--rounds", "2"]),
                        ("eligible", ["bench", "--model", "llama-1b", *LLAMA_2B, "--precision", "bf16", "fp8",
                                      "--runners", "ampkit", "--steps", "8", "--warmup", "3", "--rounds", "2",
                                      "--fp8-layers", "eligible"])]),
    "compare": ("compare --precision fp8 on charlm d2048 (32 x 512 tokens a step), 2 seeds of 150 steps, against "
                "FP32 (estimated 4 min)", 570,
                [("", ["compare", *CHARLM_BIG, "--precision", "fp8", "--seeds", "2", "--steps", "150",
                       "--no-audit"])]),
}


def _tag() -> str:
    try:
        name = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=20).stdout.splitlines()[0].split()[-1].lower()
    except (OSError, IndexError, subprocess.SubprocessError):
        name = "gpu"
    return os.environ.get("TAG") or f"{name}-{dt.datetime.now(dt.timezone.utc):%Y-%m-%d}"


def _torchao(log) -> None:
    if subprocess.run([PY, "-c", "import torchao"], capture_output=True).returncode == 0:
        return
    wheels = glob.glob(".whl/torchao-*.whl")
    if wheels:
        done = subprocess.run([PY, "-m", "pip", "install", "--no-deps", "-q", wheels[0]], capture_output=True,
                              text=True)
        log(f"torchao installed from {wheels[0]}: exit {done.returncode}")
    else:
        log("torchao is not importable and no .whl/torchao-*.whl was carried: the FP8 parts will be refused")


def probe() -> dict:
    """The cost model of each recipe and mode on this card, and what the plan predicts for the two workloads."""
    from ampkit.bench.workloads import GPT2_SMALL
    from ampkit.bench.llama import LLAMA_1B
    from ampkit.choices import FP8_RECIPES
    from ampkit.device import detect_device
    from ampkit.engine.fp8_probe import cost_model

    device = detect_device()
    d, f = GPT2_SMALL["d_model"], 4 * GPT2_SMALL["d_model"]
    gpt2 = {"tokens": GPT2_SMALL["batch_size"] * GPT2_SMALL["seq_len"],
            "layers": {"qkv": (d, 3 * d), "proj": (d, d), "fc": (d, f), "fc2": (f, d)}}
    ld, lf = LLAMA_1B["d_model"], LLAMA_1B["ffn"]
    kv = ld // LLAMA_1B["n_heads"] * LLAMA_1B["n_kv_heads"]
    llama = {"tokens": LLAMA_1B["batch_size"] * LLAMA_1B["seq_len"],
             "layers": {"q/o": (ld, ld), "k/v": (ld, kv), "gate/up": (ld, lf), "down": (lf, ld)}}
    out: dict = {"device": device.name, "capability": device.capability, "models": []}
    recipes = [r for r in os.environ.get("PROBE_RECIPES", FP8_RECIPES[0]).replace(",", " ").split() if r]
    for recipe in recipes:
        for mode in ("eager", "compiled"):
            t0 = time.perf_counter()
            cost, how = cost_model(device, recipe, mode)
            entry = {"recipe": recipe, "mode": mode, "how": how, "seconds": round(time.perf_counter() - t0, 1)}
            if cost is not None:
                entry["model"] = cost.to_dict()
                entry["ratios"] = [{"m": t.m, "k": t.k, "n": t.n, "fp8_over_bf16": t.fp8_ms / t.bf16_ms}
                                   for t in cost.timings]
                entry["predicted"] = {
                    name: {layer: {"shape": [w["tokens"], k, n], "speedup": 1 / cost.ratio(w["tokens"], k, n),
                                   "pays": cost.pays(w["tokens"], k, n)} for layer, (k, n) in w["layers"].items()}
                    for name, w in (("gpt2-small", gpt2), ("llama-1b", llama))}
            out["models"].append(entry)
    return out


def _compare_folder(name: str) -> str:
    """A compare part's ``--out``: under ``$KEEP`` when set (carried between calls), else a scratch folder."""
    name = "fp8plan-" + name.split("-fp8plan-", 1)[-1]  # the card and date stay out: a later day continues it
    return os.path.join(os.environ["KEEP"], name) if os.environ.get("KEEP") else os.path.join("/tmp", name)


def _seeds(argv: list[str]) -> list[str]:
    """The command with ``$SEEDS`` in place of its ``--seeds`` (unchanged when SEEDS is not set)."""
    if not os.environ.get("SEEDS"):
        return argv
    i = argv.index("--seeds")
    return [*argv[:i + 1], os.environ["SEEDS"], *argv[i + 2:]]


def run_part(part: str, out_dir: str, tag: str, log) -> None:
    what, limit, commands = PARTS[part]
    t_start = time.perf_counter()
    for suffix, argv in commands:
        name = f"{tag}-fp8plan-{part}" + (f"-{suffix}" if suffix else "")
        left = max(30, int(limit - (time.perf_counter() - t_start)))
        folder = _compare_folder(name) if argv[0] == "compare" else None
        if argv == ["probe"]:
            cmd = [PY, __file__, "--probe-json", os.path.join(out_dir, name + ".json")]
        elif folder is not None:
            cmd = [PY, "-m", "ampkit", *_seeds(argv), "--json", "--out", folder]
            if os.path.exists(os.path.join(folder, "compare.json")):
                cmd.append("--continue")
        else:
            cmd = [PY, "-m", "ampkit", *argv, "--json", "--out", os.path.join(out_dir, name + ".json")]
        t0 = time.perf_counter()
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=left)
            rc, tail = done.returncode, (done.stdout[-1500:] if argv[0] == "compare" else "") + done.stderr[-3000:]
        except subprocess.TimeoutExpired:
            rc, tail = 124, f"stopped after {left} s"
        if folder is not None and os.path.exists(os.path.join(folder, "compare.json")):
            shutil.copy(os.path.join(folder, "compare.json"), os.path.join(out_dir, name + ".json"))
        log(f"{name}: exit {rc} after {time.perf_counter() - t0:.0f} s")
        if rc != 0:
            with open(os.path.join(out_dir, name + ".log"), "w") as fh:
                fh.write(" ".join(cmd) + "\n" + tail)
    cache = os.environ["AMPKIT_FP8_COST_CACHE"]
    if os.path.exists(cache):
        shutil.copy(cache, os.path.join(out_dir, f"{tag}-fp8-cost-cache.json"))


def main(argv: list[str]) -> int:
    if argv[:1] == ["--probe-json"]:
        with open(argv[1], "w") as fh:
            json.dump(probe(), fh, indent=1, default=str)
        return 0
    if not argv or argv[0] == "--list":
        for name, (what, limit, _) in PARTS.items():
            print(f"  {name:15s} {what} [limit {limit} s]")
        return 0
    unknown = [p for p in argv if p not in PARTS]
    if unknown:
        print(f"unknown part(s) {', '.join(unknown)}: python {sys.argv[0]} --list", file=sys.stderr)
        return 2
    out_dir = os.environ.get("OUT") or sys.exit("set OUT to the folder the results go to")
    os.makedirs(out_dir, exist_ok=True)
    os.environ.setdefault("AMPKIT_FP8_COST_CACHE", "/tmp/ampkit-fp8-cost.json")
    os.environ["PYTHONPATH"] = "src" + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")
    tag = _tag()
    steps = open(os.path.join(out_dir, "steps.txt"), "a")

    def log(line: str) -> None:
        print(line, flush=True)
        steps.write(line + "\n")
        steps.flush()

    log(f"{dt.datetime.now(dt.timezone.utc).isoformat(timespec='seconds')} commit "
        f"{os.environ.get('AMPKIT_GIT_COMMIT', 'unknown')} cache {os.environ['AMPKIT_FP8_COST_CACHE']}")
    _torchao(log)
    for part in argv:
        run_part(part, out_dir, tag, log)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
