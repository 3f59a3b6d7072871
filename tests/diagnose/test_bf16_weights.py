"""bf16-weights-without-master measures the share of updates that BF16 storage rounded away."""

import re
from pathlib import Path

from ampkit.diagnose import diagnose_script

PLANTED = Path(__file__).parent / "corpus2" / "bf16_pure_finetune.py"


def _share(result) -> float:
    (finding,) = [f for f in result.findings if f.code == "bf16-weights-without-master"]
    return float(re.search(r"([\d.]+)% of the updates", finding.message)[1]) / 100


def test_the_share_of_lost_updates_is_measured(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    small = _share(diagnose_script(str(PLANTED)))
    assert small > 0.9  # lr 1e-5 on weights ~0.05: nearly every update is below half a rounding step
    big_lr = tmp_path / "big_lr.py"
    big_lr.write_text(PLANTED.read_text().replace("lr=1e-5", "lr=3e-2"))
    large = _share(diagnose_script(str(big_lr)))
    assert large < 0.3  # updates of about 3e-2 survive BF16 rounding: the measurement says so
