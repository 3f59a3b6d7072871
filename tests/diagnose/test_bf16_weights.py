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
