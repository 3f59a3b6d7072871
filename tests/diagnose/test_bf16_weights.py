"""bf16-weights-without-master is measured: reported when most updates were rounded away, not otherwise."""

import re
from pathlib import Path

from ampkit.diagnose import diagnose_script

PLANTED = Path(__file__).parent / "corpus2" / "bf16_pure_finetune.py"


def test_the_share_of_lost_updates_is_measured(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (finding,) = [f for f in diagnose_script(str(PLANTED)).findings if f.code == "bf16-weights-without-master"]
    assert int(re.search(r"\((\d+)%\) with a non-zero gradient", finding.message)[1]) > 90  # lr 1e-5: nearly all lost
    big_lr = tmp_path / "big_lr.py"
    big_lr.write_text(PLANTED.read_text().replace("lr=1e-5", "lr=3e-2"))
    assert not [f for f in diagnose_script(str(big_lr)).findings if f.code == "bf16-weights-without-master"]


JUDGED = Path(__file__).parents[1] / "judges" / "corpus" / "diagnose" / "bf16_weights_without_master.py"


def test_one_parameter_tensor_that_never_moves_is_enough(tmp_path, monkeypatch):
    # A litgpt-style block at lr 4e-4: only 8 % of the model's updates are lost, but all of its RMSNorm scales'.
    monkeypatch.chdir(tmp_path)
    (finding,) = [f for f in diagnose_script(str(JUDGED)).findings if f.code == "bf16-weights-without-master"]
    assert int(re.search(r"\((\d+)%\) with a non-zero gradient", finding.message)[1]) < 50
    assert "norm_1.weight 100%" in finding.message and finding.where.endswith("bf16_weights_without_master.py:55")
    (tmp_path / "_judge.py").write_text((JUDGED.parent / "_judge.py").read_text())
    big_lr = tmp_path / "big_lr.py"
    big_lr.write_text(JUDGED.read_text().replace("lr=4e-4", "lr=3e-2"))
    assert not [f for f in diagnose_script(str(big_lr)).findings if f.code == "bf16-weights-without-master"]
