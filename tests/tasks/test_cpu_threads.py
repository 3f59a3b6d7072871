"""A task's ``cpu_threads``: the CPU runs of the task use that many intra-op threads, torch's count comes back
after, and a user's OMP_NUM_THREADS wins (the built-in digits sets 1: a busy CPU's waiting threads cost it 7x)."""

from __future__ import annotations

import pytest
import torch

import ampkit
from ampkit.tasks import load_task


def _toy(cpu_threads, seen):
    x, y = torch.randn(16, 4, generator=torch.Generator().manual_seed(0)), torch.randn(16, 1)

    def loss(model, batch):
        seen.append(torch.get_num_threads())
        return torch.nn.functional.mse_loss(model(batch[0]), batch[1])

    return ampkit.Task(name="toy", model=torch.nn.Linear(4, 1), batch=lambda step: (x, y), loss=loss,
                       cpu_threads=cpu_threads)


@pytest.fixture
def two_threads(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def _train(task):
    return ampkit.train(ampkit.TrainConfig(precision="fp32", steps=3, log_every=1, device="cpu", evaluate=False),
                        task=task)


def test_the_task_runs_with_its_threads_and_torch_gets_its_count_back(two_threads):
    seen = []
    _train(_toy(1, seen))
    assert seen == [1, 1, 1]
    assert torch.get_num_threads() == 2


def test_no_setting_keeps_torch_default(two_threads):
    seen = []
    _train(_toy(None, seen))
    assert seen == [2, 2, 2]


def test_a_users_omp_num_threads_wins(two_threads, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    seen = []
    _train(_toy(1, seen))
    assert seen == [2, 2, 2]


def test_the_count_comes_back_when_training_fails(two_threads):
    def boom(model, batch):
        raise RuntimeError("boom")

    task = _toy(1, [])
    task.loss = boom
    with pytest.raises(Exception):
        _train(task)
    assert torch.get_num_threads() == 2


def test_digits_asks_for_one_thread_on_the_cpu():
    assert load_task("digits", device="cpu").cpu_threads == 1
