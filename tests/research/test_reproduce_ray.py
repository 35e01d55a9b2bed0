"""`fedfair reproduce --ray`: a study's runs as Ray tasks give the process pool's numbers, cached alike.

Ray is an optional extra (`fedfair[ray]`): the tests that need it are skipped where it is not
installed; the one that checks the error naming the fix runs everywhere. Starting a local Ray cluster
costs some 20 CPU-seconds, so the run through it is marked `study` (`make test-studies`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedfair.cli import main as cli_main
from fedfair.core.errors import ConfigError
from fedfair.research import runs
from fedfair.research.study import Study
from fedfair.research.runs import Run, run_all
from tests.research.test_reproduce import TINY


@pytest.fixture
def local_ray() -> Iterator[None]:
    """A private Ray instance of two CPUs and a small object store (the runs' results are tiny)."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=100 * 1024 * 1024)
    yield
    ray.shutdown()


def tiny_runs() -> list[Run]:
    """Validation and test runs of two methods, two step sizes and two seeds: eight runs."""
    study = Study("adult", TINY, ("fedsrcvar", "fedavg"))
    selection = [run for method in study.methods for run in study.selection_runs(method, 0.3)]
    point = study.grid("fedsrcvar", 0.3)[0]
    return selection + study.test_runs("fedsrcvar", 0.3, point)


@pytest.mark.study
def test_ray_tasks_give_the_process_pools_results_bit_for_bit_and_cache_them(
    local_ray: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    planned = tiny_runs()
    pooled = run_all(planned, tmp_path / "pool", workers=2, label="pool")
    on_ray = run_all(planned, tmp_path / "ray", workers=1, label="ray", on_ray=True)
    assert on_ray == pooled  # same flags, same numbers: floats compared exactly
    for run in planned:
        cached = (tmp_path / "ray" / f"{run.key}.json").read_bytes()
        assert cached == (tmp_path / "pool" / f"{run.key}.json").read_bytes()
        assert json.loads(cached) == on_ray[run]

    def no_training(run: Run) -> dict[str, float]:
        raise AssertionError(f"{run} trained again although it is cached")

    monkeypatch.setattr(runs, "execute", no_training)
    assert run_all(planned, tmp_path / "ray", workers=1, label="cached", on_ray=True) == on_ray


def test_ray_runs_need_a_connection(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    import ray

    assert not ray.is_initialized()
    with pytest.raises(ConfigError, match=r"ray_connection\(ADDRESS\)"):
        run_all(tiny_runs()[:1], tmp_path, workers=1, label="ray", on_ray=True)


def test_without_ray_the_flag_names_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now fails as if it were not installed
    assert cli_main(["reproduce", "--out", str(tmp_path), "--ray", "local"]) == 2
    error = capsys.readouterr().err
    assert "pip install 'fedfair-rcvar[ray]'" in error and "-c constraints.txt -e '.[ray]'" in error
