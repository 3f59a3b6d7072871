"""Which checkpoint is the last good one (:mod:`ampkit.checkpoint.rotation`): the streak of consecutive skips
at the save decides, not the run's total; a name whose file is gone is never given; rotation spares it."""

from __future__ import annotations

from ampkit.checkpoint.rotation import is_good, last_good, mark_good, rotate


def _amp(skipped: int, consecutive: int, longest: int | None = None) -> dict:
    # MixedPrecision.state_dict()["counters"]: 0 skipped in total, 1 consecutive skips, 2 the longest streak
    # since the last read, 3 the last grad norm, ...
    return {"counters": [skipped, consecutive, consecutive if longest is None else longest, 0.0, 0.0]}


def test_good_reads_the_consecutive_skips_not_the_total():
    assert is_good(_amp(skipped=1, consecutive=0))  # one early skip, then healthy steps: good
    assert is_good(_amp(skipped=7, consecutive=0))
    assert is_good(_amp(skipped=3, consecutive=0, longest=3))  # a streak that ended before the save
    assert not is_good(_amp(skipped=1, consecutive=1))  # saved in a streak
    assert not is_good(_amp(skipped=0, consecutive=3))
    assert is_good(None) and is_good({})  # no engine state: nothing says otherwise


def test_last_good_never_names_a_checkpoint_whose_file_is_gone(tmp_path):
    path = tmp_path / "step-00000010.pt"
    path.write_bytes(b"x")
    mark_good(tmp_path, 10, path)
    assert last_good(tmp_path) == (10, path)
    path.unlink()
    assert last_good(tmp_path) is None
    (tmp_path / "last-good.json").write_text("{not json")
    assert last_good(tmp_path) is None


def test_rotation_keeps_the_newest_and_spares_the_last_good(tmp_path):
    entries = []
    for step in (5, 10, 15, 20):
        p = tmp_path / f"step-{step:08d}.pt"
        p.write_bytes(b"x")
        entries.append((step, p))
    mark_good(tmp_path, 5, entries[0][1])
    rotate(entries, 2, tmp_path, lambda p: p.unlink())
    assert sorted(p.name for p in tmp_path.glob("*.pt")) == ["step-00000005.pt", "step-00000015.pt",
                                                              "step-00000020.pt"]


def test_an_engine_with_one_early_skip_saves_good_checkpoints_again():
    import torch
    from torch import nn

    from ampkit.engine import MixedPrecision

    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    amp = MixedPrecision("fp16")
    x = torch.randn(8, 4)
    amp.backward(model(x).float().mean() * float("inf"))  # step 1 skipped
    amp.step(opt)
    assert not is_good(amp.state_dict())
    for _ in range(3):
        amp.backward(model(x).float().mean())
        amp.step(opt)
    assert amp.stats()["skipped"] == 1 and is_good(amp.state_dict())
