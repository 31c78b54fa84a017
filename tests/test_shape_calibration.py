"""scripts/shape_calibration.py: the per-shape table read from bench summaries (hand-written ones)."""

import json
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
sys.path.insert(0, str(SCRIPTS))

import shape_calibration  # noqa: E402


def write_run(path: Path, fit_calibration: dict) -> Path:
    path.mkdir()
    (path / "summary.json").write_text(json.dumps({"fit_calibration": fit_calibration}))
    return path


def test_the_table_lists_each_method_and_shape(tmp_path, capsys):
    run = write_run(tmp_path / "run-a", {
        "suffix": {"committed": 10.0, "by_shape": {"h0 s1": dict(tried=4, estimate=0.5, accepted=0.25),
                                                    "h3 s1": dict(tried=8, estimate=0.6, accepted=0.875)}},
        "oilbird": {"committed": 12.0, "by_shape": {"h1 s3": dict(tried=5, estimate=0.3, accepted=0.2)}}})
    assert shape_calibration.main([str(run), "--methods", "suffix"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[2:] == ["| run-a | suffix | h0 s1 | 4 | 0.500 | 0.250 |",
                       "| run-a | suffix | h3 s1 | 8 | 0.600 | 0.875 |"]


def test_a_run_without_the_table_is_named_not_printed_empty(tmp_path, capsys):
    run = write_run(tmp_path / "old", {"suffix": {"committed": 10.0, "predicted": 9.0}})
    with pytest.raises(SystemExit):
        shape_calibration.main([str(run)])
    assert "before stop 58" in capsys.readouterr().err


def test_a_directory_that_is_not_a_run_is_named(tmp_path, capsys):
    with pytest.raises(SystemExit):
        shape_calibration.main([str(tmp_path / "nowhere")])
    assert "no summary.json in" in capsys.readouterr().err
