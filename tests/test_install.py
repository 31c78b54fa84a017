"""The install recipe (Makefile): torch is pinned, and the user chooses its build."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def dry_run(tmp_path, *variables: str) -> str:
    """The commands `make install` would run for a fresh venv, without running them."""
    proc = subprocess.run(["make", "-n", "-B", "install", f"VENV={tmp_path / 'venv'}", *variables],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_torch_is_pinned_and_its_build_is_the_users_choice(tmp_path):
    torch_line = next(line for line in dry_run(tmp_path).splitlines() if "install torch" in line)
    assert "torch==2.13.0" in torch_line and "--index-url" not in torch_line  # PyPI's default build
    cpu = "https://download.pytorch.org/whl/cpu"
    torch_line = next(line for line in dry_run(tmp_path, f"TORCH_INDEX={cpu}").splitlines() if "install torch" in line)
    assert f"torch==2.13.0 --index-url {cpu}" in torch_line
    # The index is used for torch alone: the project and its other dependencies come from PyPI.
    assert not [line for line in dry_run(tmp_path, f"TORCH_INDEX={cpu}").splitlines()
                if cpu in line and "install torch" not in line]
