"""The built wheel works outside the repository: installed (not editable) into a fresh virtual
environment and run from `/`, `fedfair --version` answers, `fedfair simulate --dataset adult`
trains on the Adult files inside the installed package, and `fedfair launch` runs a whole
federation (certificates, aggregator and collaborator processes over mutual TLS) from it. That
launch is also `launch --no-keep`'s test (tests/runtime/local/test_launch.py has the others): its
last line says the temporary workspace is removed, and it is. The
distribution is `fedfair-rcvar` (the index's `fedfair` is another project's); the import and the
command are `fedfair`.

The fresh environment gets only fedfair itself from the wheel (`--no-deps`); it sees the
project's .venv site-packages through a .pth line, so torch and the other pinned
dependencies are not downloaded again. A .pth line adds a folder to the path without
processing that folder's own .pth files, so .venv's editable fedfair stays invisible.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import fedfair

REPOSITORY = Path(__file__).resolve().parents[1]
BUILD_TIMEOUT_S = 300
RUN_TIMEOUT_S = 300


def run(
    command: list[str], cwd: Path, timeout: int = RUN_TIMEOUT_S, **variables: str
) -> subprocess.CompletedProcess[str]:
    """Run without the caller's PYTHONPATH, so nothing but the installed package can be imported (and with
    `variables` set in the environment)."""
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"} | variables
    result = subprocess.run(
        command, check=False, cwd=cwd, env=environment, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stdout}\n{result.stderr}"
    return result


def build_wheel(destination: Path) -> Path:
    """The wheel of a copy of the sources (building in the checkout would race other test runs)."""
    source = destination / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPOSITORY / name, source / name)
    shutil.copytree(REPOSITORY / "fedfair", source / "fedfair", ignore=shutil.ignore_patterns("__pycache__"))
    command = [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation",
               "--no-index", "--quiet", "-w", str(destination / "dist")]  # fmt: skip
    run(command, destination, timeout=BUILD_TIMEOUT_S)
    (wheel,) = (destination / "dist").glob("fedfair_rcvar-*.whl")
    return wheel


def fresh_environment(folder: Path, wheel: Path) -> Path:
    """A new venv from this interpreter with only the wheel installed, seeing .venv's dependencies."""
    run([sys.executable, "-m", "venv", "--without-pip", str(folder)], folder.parent)
    python = folder / "bin" / "python"
    where = run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], folder)
    site_packages = Path(where.stdout.strip())
    (site_packages / "dependencies-from-project-venv.pth").write_text(sysconfig.get_path("purelib") + "\n")
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "--quiet",
         str(wheel)], folder)  # fmt: skip
    return folder


@pytest.mark.slow
def test_the_installed_wheel_runs_from_any_folder(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    environment = fresh_environment(tmp_path / "venv", wheel)
    fedfair_command = str(environment / "bin" / "fedfair")
    root = Path("/")

    assert run([fedfair_command, "--version"], root).stdout.strip() == f"fedfair {fedfair.__version__}"
    where = run(
        [str(environment / "bin" / "python"), "-c",
         "import fedfair, fedfair.datasets.registry as r; print(fedfair.__file__); print(r.BUNDLED_DATA_DIR)"],
        root,
    ).stdout.split()  # fmt: skip
    installed = environment.resolve()
    assert all(Path(path).resolve().is_relative_to(installed) for path in where), where
    assert sorted(path.name for path in (Path(where[1]) / "adult").iterdir()) == ["adult.data.xz", "adult.test.xz"]

    result = run([fedfair_command, "simulate", "--dataset", "adult", "--rounds", "5", "--json",
                  str(tmp_path / "result.json")], root)  # fmt: skip
    assert (tmp_path / "result.json").is_file(), result.stdout

    # The sites' logs point at model bundles inside the temporary folder; the last word says it is gone.
    temporary = tmp_path / "temporary"
    temporary.mkdir()
    launched = run([fedfair_command, "launch", "--rounds", "3", "--collaborators", "2", "--no-fedavg",
                    "--no-keep"], root, TMPDIR=str(temporary))  # fmt: skip
    assert "worst" in launched.stdout.lower(), launched.stdout
    assert launched.stdout.rstrip().splitlines()[-1].endswith("The workspace is removed now (--no-keep).")
    assert not list(temporary.glob("fedfair-launch-*"))
