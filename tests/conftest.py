"""Shared fixtures. The simulated MUSA namespace lives in tests/musa_sim.py and is reached only
through the ``simulated_musa`` / ``simulated_cuda`` fixtures below."""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

import musa_sim  # noqa: E402


def _share_the_cores_between_workers() -> None:
    """Under pytest-xdist (``-n N``), N workers run at once: each takes its share of the CPUs for torch's intra-op
    threads, and so do the processes its tests start (OMP_NUM_THREADS is inherited), instead of every worker and
    child starting one thread per CPU (on 2 cores, 2 workers x 2 threads made every test about 1.7x slower)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if not os.environ.get("PYTEST_XDIST_WORKER") or workers < 1:
        return
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    share = max(1, cpus // workers)
    os.environ.setdefault("OMP_NUM_THREADS", str(share))  # a value the user set stands
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


_share_the_cores_between_workers()


@pytest.fixture
def simulated_musa(monkeypatch):
    """Call with a card name (``"MTT S80"``, ``"MTT S4000"``, ...) to register a simulated torch.musa."""
    monkeypatch.delenv("AMPKIT_DEVICE", raising=False)

    def install(name: str, **kw):
        return musa_sim.install_musa(monkeypatch, name, **kw)

    return install


@pytest.fixture
def simulated_cuda(monkeypatch):
    """Call with a compute capability to make the CPU-only torch report one NVIDIA card."""
    monkeypatch.delenv("AMPKIT_DEVICE", raising=False)

    def install(capability, name=None):
        musa_sim.install_cuda(monkeypatch, capability, name)

    return install


@pytest.fixture(autouse=True)
def _deterministic(monkeypatch):
    monkeypatch.delenv("AMPKIT_DEVICE", raising=False)
    torch.manual_seed(0)
    yield


def _cwd_entries() -> set[str]:
    here = os.getcwd()
    found = set(os.listdir(here))
    for sub in ("runs",):  # the default output folders (compare: runs/compare-N; train's tensorboard: runs/)
        if os.path.isdir(os.path.join(here, sub)):
            found |= {os.path.join(sub, name) for name in os.listdir(os.path.join(here, sub))}
    return found


@pytest.fixture(autouse=True)
def _writes_only_to_temporary_folders():
    """A test writes into tmp_path only: nothing new may appear in the working folder (a command run without
    --out writes runs/compare-N there, in the user's checkout)."""
    cwd, before = os.getcwd(), _cwd_entries()
    yield
    if os.getcwd() == cwd:  # a test that changed folder (monkeypatch.chdir) is back by now; else nothing to see
        new = sorted(_cwd_entries() - before - {"__pycache__", ".pytest_cache", ".coverage"})
        beside = (" or a test running beside it in another pytest-xdist worker did"
                  if os.environ.get("PYTEST_XDIST_WORKER") else "")
        assert not new, (f"the test wrote into the working folder {cwd}{beside}: {new} (give it an --out under "
                         "tmp_path)")


def _shared_work(item) -> str | None:
    """What ``item`` shares with other tests through a fixture built once (module, package or session scope) in
    these test files, or None: the tests that share one must run in one xdist worker, else each worker builds it
    again (a comparison, a torchrun matrix: tens of seconds each)."""
    info = getattr(item, "_fixtureinfo", None)
    shared = []
    for defs in (info.name2fixturedefs.values() if info else ()):
        fixture = defs[-1]
        if fixture.scope == "function" or not fixture.baseid:  # pytest's and plugins' own (tmp_path_factory)
            continue
        shared.append((fixture.scope, fixture.baseid, fixture.argname))
    if not shared:
        return None
    if any(scope != "module" for scope, _, _ in shared):  # one group per conftest folder of shared results
        return "shared:" + min(baseid for scope, baseid, _ in shared if scope != "module")
    return "shared:" + item.nodeid.split("::")[0]


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the xdist_group marks (--dist loadgroup)
def pytest_collection_modifyitems(config, items):
    for item in items:
        group = _shared_work(item)
        if group and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(group))
    _skip_missing_hardware(items)


def _skip_missing_hardware(items):
    has_accel = torch.cuda.is_available() or bool(getattr(torch, "musa", None) and torch.musa.is_available())
    multi = has_accel and torch.cuda.is_available() and torch.cuda.device_count() >= 2
    skip_gpu = pytest.mark.skip(reason="needs a CUDA/MUSA accelerator (run through the device tool)")
    skip_multi = pytest.mark.skip(reason="needs two or more GPUs")
    for item in items:
        if item.get_closest_marker("gpu") and not has_accel:
            item.add_marker(skip_gpu)
        if item.get_closest_marker("multi_gpu") and not multi:
            item.add_marker(skip_multi)
