"""The `oilbird diagnose` replay on the real model: its disk cache and the within-request pool (oilbird.gap_replay)."""

import oilbird.gap_replay as gap_replay
from oilbird.gap_measures import DiagnosisConfig
from oilbird.gap_report import plot_diagnosis


def test_diagnose_command_on_the_real_model_caches_its_replay(smol, tmp_path, monkeypatch):
    monkeypatch.setattr(gap_replay, "default_cache_dir", lambda: tmp_path / "cache")
    config = gap_replay.ReplayConfig(dataset="api-bank/level-1-api", limit=3, max_new_tokens=8)
    first = gap_replay.run_diagnosis(smol, config, out_dir=tmp_path / "out", progress=False)
    assert first["requests"] == 3 and first["overall"]["positions"] > 0
    assert len((tmp_path / "out" / "positions.jsonl").read_text().splitlines()) == 3
    calls = []
    monkeypatch.setattr(gap_replay, "greedy_reference", lambda *a, **k: calls.append(a))
    second = gap_replay.run_diagnosis(smol, config, progress=False)
    assert not calls and second["overall"] == first["overall"]  # nothing decoded the second time
    plot_diagnosis(second, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").stat().st_size > 1000
    # The request's own committed text only adds to the pool: every rate of presence can only grow.
    within = gap_replay.run_diagnosis(smol, config, DiagnosisConfig(within_request=True), progress=False)
    assert not calls and within["overall"]["positions"] == first["overall"]["positions"]
    assert within["overall"]["presence"] >= first["overall"]["presence"]
    assert within["overall"]["oracle_miss"] <= first["overall"]["oracle_miss"]
