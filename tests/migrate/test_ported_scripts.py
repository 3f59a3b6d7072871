"""Real CUDA training scripts, ported by ``ampkit migrate --target musa --fix`` (the CLI), run for a few steps
on the simulated MUSA card (musa_device.py) in a child process.

For each script (tests/migrate/scripts/, each with a header naming its repository, commit and path):
* the original does not train on the simulated MUSA machine (it raises on "cuda", or trains on the CPU
  because torch.cuda.is_available() is False there): the harness tells a port from no port;
* the ported one trains on "musa": every parameter a backward reaches is on musa, the losses are finite,
  every GradScaler is a musa one and enabled where the script asks for AMP, autocast runs on musa in FP16;
* every cuda/nccl left in the ported files is accounted for (cuda_accounting.py): reported by migrate, on
  a finding or a "could not port" summary line, or in a harmless place.
"""

from __future__ import annotations

import contextlib
import io
import json
import pickle
import random
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from ampkit.cli import main as ampkit_main

from . import cuda_accounting
from .test_musa_device import RUNNER, child_env

SCRIPTS = Path(__file__).resolve().parent / "scripts"


def _wlm_corpus(folder: Path) -> None:
    """word_language_model reads a corpus folder (wikitext-2 in the repository): a small synthetic one."""
    rng = random.Random(0)
    words = "the cat sat on a mat and dog ran to park with big red ball in sun".split()
    (folder / "corpus").mkdir()
    for name, n in (("train", 60), ("valid", 15), ("test", 15)):
        lines = (" ".join(rng.choice(words) for _ in range(rng.randint(4, 12))) for _ in range(n))
        (folder / "corpus" / f"{name}.txt").write_text("\n".join(lines) + "\n")


def _nanogpt_data(folder: Path) -> None:
    """nanoGPT memory-maps data/<dataset>/{train,val}.bin (prepare.py writes them): random tokens instead."""
    data = folder / "data" / "tiny"
    data.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name, n in (("train", 4000), ("val", 1000)):
        rng.integers(0, 65, n, dtype=np.uint16).tofile(data / f"{name}.bin")
    (data / "meta.pkl").write_bytes(pickle.dumps({"vocab_size": 65}))


@dataclass(frozen=True)
class Script:
    folder: str
    entry: str
    args: tuple[str, ...]
    setup: object = None
    amp: bool = False  # the script trains with autocast FP16 + GradScaler
    original_error: str | None = None  # what the unported script raises here; None: it trains on the CPU
    expected_reports: dict = field(default_factory=dict)  # kind -> count of "could not port" lines


CASES = {
    "mnist": Script("mnist", "main.py", ("--epochs", "1", "--dry-run")),
    "dcgan": Script("dcgan", "main.py", ("--dataset", "fake", "--cuda", "--dry-run", "--workers", "0", "--batchSize", "4",
                                         "--ngf", "8", "--ndf", "8", "--nz", "16", "--manualSeed", "1", "--outf", "out"),
                    original_error="Torch not compiled with CUDA enabled"),
    "word_language_model": Script("word_language_model", "main.py",
                                  ("--cuda", "--epochs", "1", "--dry-run", "--data", "corpus", "--emsize", "16", "--nhid",
                                   "16", "--bptt", "8", "--batch_size", "4", "--save", "model.pt"),
                                  setup=_wlm_corpus, original_error="Torch not compiled with CUDA enabled"),
    "nanogpt": Script("nanogpt", "train.py",
                      ("--dataset=tiny", "--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=32", "--batch_size=4",
                       "--max_iters=4", "--eval_iters=2", "--eval_interval=2", "--compile=False", "--dtype=float16",
                       "--gradient_accumulation_steps=2", "--log_interval=1", "--always_save_checkpoint=True",
                       "--out_dir=out", "--dropout=0.1"),
                      setup=_nanogpt_data, amp=True, original_error="CUDA is not available",
                      expected_reports={"no twin": 1}),
    "amp_recipe": Script("amp_recipe", "amp_recipe.py", (), amp=True,
                         original_error="Torch not compiled with CUDA enabled"),
}


@dataclass
class Run:
    folder: Path
    proc: subprocess.CompletedProcess
    record: dict
    migrate_output: str = ""
    originals: dict = field(default_factory=dict)  # file name -> text before the port


def _copy(case: Script, dest: Path) -> Path:
    shutil.copytree(SCRIPTS / case.folder, dest)
    if case.setup is not None:
        case.setup(dest)
    return dest


def _run(case: Script, folder: Path) -> tuple[subprocess.CompletedProcess, dict]:
    record = folder / "record.json"
    proc = subprocess.run([sys.executable, str(RUNNER), "--record", str(record), case.entry, *case.args],
                          cwd=folder, capture_output=True, text=True, timeout=180, env=child_env())
    assert record.exists(), f"the runner wrote no record:\n{proc.stderr[-3000:]}"
    return proc, json.loads(record.read_text())


def port(folder: Path) -> str:
    """``ampkit migrate --target musa --fix --jobs 1 FOLDER`` through the CLI; its stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = ampkit_main(["migrate", "--target", "musa", "--fix", "--jobs", "1", str(folder)])
    assert code in (0, 1), err.getvalue()
    return out.getvalue() + err.getvalue()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    cache: dict[tuple[str, str], Run] = {}

    def get(name: str, which: str) -> Run:
        if (name, which) not in cache:
            case = CASES[name]
            folder = _copy(case, tmp_path_factory.mktemp(f"{name}_{which}") / case.folder)
            originals = {p.name: p.read_text() for p in folder.glob("*.py")}
            output = port(folder) if which == "ported" else ""
            proc, record = _run(case, folder)
            cache[name, which] = Run(folder, proc, record, output, originals)
        return cache[name, which]

    return get


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_original_does_not_train_on_musa(runs, name):
    """The harness discriminates: unported, the script fails on the simulated MUSA machine."""
    case, run = CASES[name], runs(name, "original")
    assert "musa" not in run.record["leaf_devices"], run.record
    if case.original_error is None:  # torch.cuda.is_available() is False on a MUSA machine: the CPU it is
        assert run.proc.returncode == 0, run.proc.stderr[-3000:]
        assert run.record["leaf_devices"] == ["cpu"], run.record
    else:
        assert run.proc.returncode != 0 and case.original_error in (run.record["error"] or ""), run.record["error"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_ported_script_trains_on_musa(runs, name):
    case, run = CASES[name], runs(name, "ported")
    rec = run.record
    assert run.proc.returncode == 0 and rec["error"] is None, run.proc.stderr[-4000:]
    assert rec["leaf_devices"] == ["musa"], rec
    assert set(rec["param_devices"]) <= {"musa"}, rec
    assert rec["losses_finite"], rec["losses"]
    assert {a["device_type"] for a in rec["autocast"]} <= {"musa"}, rec["autocast"]
    assert all(s["device"] == "musa" for s in rec["scalers"]), rec["scalers"]
    if case.amp:
        assert rec["scalers"] and all(s["enabled"] for s in rec["scalers"]), rec["scalers"]
        assert rec["autocast"] and "float16" in rec["linear_dtypes"], rec
        assert rec["steps"] > 0


# Ported and accounted for, not run: imagenet/main.py needs torchvision's models and ImageNet (or a
# FakeData of 1.28 million images); its cuda lines (.cuda(args.gpu), set_device, DataParallel) are the point.
ACCOUNT_ONLY = {"imagenet": {"device index": 4}}


def check_accounting(folder: Path, originals: dict, migrate_output: str, expected_reports: dict) -> None:
    problems, kinds = [], {}
    for path in sorted(folder.glob("*.py")):
        reported = cuda_accounting.reported_lines(migrate_output, str(path))
        mentions = cuda_accounting.account(path.read_text(), original=originals[path.name], reported=reported)
        problems += [f"{path.name}:{m}" for m in cuda_accounting.unaccounted(mentions)]
    for line in migrate_output.splitlines():
        if line.startswith("could not port ("):
            kind = line[len("could not port ("):line.index(")")]
            kinds[kind] = int(line.split(": ")[1].split()[0])
    assert not problems, "cuda left behind, not reported by migrate:\n" + "\n".join(problems) + \
        "\n--- migrate said:\n" + migrate_output
    assert kinds == expected_reports, migrate_output


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_cuda_left_is_accounted_for(runs, name):
    run = runs(name, "ported")
    check_accounting(run.folder, run.originals, run.migrate_output, CASES[name].expected_reports)


@pytest.mark.parametrize("name", sorted(ACCOUNT_ONLY))
def test_every_cuda_left_is_accounted_for_in_a_script_not_run(tmp_path, name):
    folder = tmp_path / name
    shutil.copytree(SCRIPTS / name, folder)
    originals = {p.name: p.read_text() for p in folder.glob("*.py")}
    output = port(folder)
    assert any(p.read_text() != originals[p.name] for p in folder.glob("*.py")), "migrate changed nothing"
    check_accounting(folder, originals, output, ACCOUNT_ONLY[name])
