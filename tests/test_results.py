"""The cross-run comparison table and plot, from hand-written benchmark records."""

import json

import pytest

from oilbird.errors import DatasetError
from oilbird.results import (comparison_table, load_run, merge_runs, plot_comparison, semantic_report,
                             source_shares)


def _write_run(path, dataset, model, per_method, cut=False):
    """per_method: label -> (tokens, forwards, wall_s) for each of two requests."""
    path.mkdir(parents=True)
    lines = []
    for rid in ("r0", "r1"):
        for method, (tokens, forwards, wall) in per_method.items():
            lines.append(json.dumps(dict(
                method=method, request_id=rid, category=None, new_tokens=tokens, forwards=forwards,
                wall_s=wall, draft_s=0.01, forward_s=wall - 0.02, bookkeeping_s=0.01,
                accepted_drafts=tokens - forwards,
                accepted_sources={"pld": tokens - forwards, "tr": 1} if method.startswith("goose") else {},
                sole_sources={"pld": tokens - forwards - 1} if method.startswith("goose") else {},
                audit=dict(lossless=True))))
    if cut:  # the run stopped after one method of the second request
        lines = lines[: len(per_method) + 1]
    (path / "records.jsonl").write_text("\n".join(lines) + "\n")
    if not cut:
        (path / "summary.json").write_text(json.dumps(dict(
            config=dict(dataset=dataset), model=dict(name=model),
            rows=[dict(method=m, memory_bytes=2**20 if m != "ar" else None) for m in per_method])))


def test_table_shows_tau_and_same_run_speedup_per_dataset(tmp_path):
    _write_run(tmp_path / "a", "api-bank", "smol", {"ar": (10, 10, 1.0), "goose@60": (10, 4, 0.5)})
    _write_run(tmp_path / "b", "humaneval", "smol", {"ar": (10, 10, 2.0), "goose@60": (10, 5, 2.5)})
    runs = [load_run(tmp_path / "a"), load_run(tmp_path / "b")]
    table = comparison_table(runs)
    assert "| goose@60 | 2.50 | 2.00x [2.00–2.00] (2.00x) | 2.00 | 0.80x [0.80–0.80] (0.80x) | 4/4 |" in table
    assert "| ar | 1.00 | 1.00x (1.00x) | 1.00 | 1.00x (1.00x) | 4/4 |" in table
    assert table.splitlines()[0] == "**smol**" and "1.0 |" in table  # pool memory, MiB
    assert "goose@60: pld" in source_shares(runs)
    png = tmp_path / "plot.png"
    plot_comparison(runs, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_cut_run_reports_only_requests_every_method_finished(tmp_path):
    _write_run(tmp_path / "a", "api-bank", "smol", {"ar": (10, 10, 1.0), "pld": (10, 4, 0.5)}, cut=True)
    run = load_run(tmp_path / "a")
    assert run.requests == 1 and run.rows["pld"]["requests"] == 1


def test_missing_run_is_a_clear_error(tmp_path):
    with pytest.raises(DatasetError, match="oilbird bench --out"):
        load_run(tmp_path / "nothing")


def test_runs_over_the_same_requests_merge_into_one_column(tmp_path):
    _write_run(tmp_path / "a", "api-bank", "smol", {"ar": (10, 10, 1.0), "goose@60": (10, 4, 0.5)})
    _write_run(tmp_path / "b", "api-bank", "smol",
               {"ar": (10, 10, 2.0), "goose@auto": (10, 5, 1.0), "goose@60": (10, 2, 1.0)})
    runs = merge_runs([load_run(tmp_path / "a"), load_run(tmp_path / "b")])
    assert len(runs) == 1 and list(runs[0].rows) == ["ar", "goose@60", "goose@auto"]
    assert runs[0].rows["goose@auto"]["speedup"] == 2.0  # against run b's own ar
    assert runs[0].rows["goose@60"]["tau"] == 5.0  # the re-run supersedes
    assert runs[0].rows["ar"]["tokens_per_s"] == 10.0  # the first run's baseline stays
    _write_run(tmp_path / "c", "api-bank", "smol", {"ar": (10, 10, 1.0)})
    records = tmp_path / "c" / "records.jsonl"
    records.write_text(records.read_text().splitlines()[0] + "\n")  # one request only
    with pytest.raises(DatasetError, match="same requests"):
        merge_runs([load_run(tmp_path / "a"), load_run(tmp_path / "c")])


def test_semantic_report_pairs_ablations_and_costs(tmp_path):
    _write_run(tmp_path / "a", "api-bank", "smol", {
        "ar": (10, 10, 1.0), "goose": (10, 5, 1.0), "oilbird": (10, 4, 1.0),
        "oilbird[sem_entry_budget=0]": (10, 5, 1.0), "oilbird[sem_layer=0]": (10, 5, 1.0),
        "pld": (10, 8, 1.0), "oilbird-pld": (10, 5, 1.0)})
    records = (tmp_path / "a" / "records.jsonl").read_text().splitlines()
    stats = dict(cycles=4, fired=2, retrieve_s=0.004, merge_s=0.0, harvest_s=0.004, sem_paid=10,
                 sem_paid_accepted=2, store_records=100, bytes_per_record=1160, theta=0.7, faiss=False)
    patched = []
    for line in records:
        record = json.loads(line)
        if record["method"] == "oilbird":
            record.update(drafter_stats=stats, sole_sources={"sem": 1}, accepted_drafts=6)
        patched.append(json.dumps(record))
    (tmp_path / "a" / "records.jsonl").write_text("\n".join(patched) + "\n")
    report = semantic_report([load_run(tmp_path / "a")])
    assert "| 2.00 → 2.50 | +25.0% |" in report  # controlled pair and goose -> oilbird
    assert "transplant into prompt lookup: pld → oilbird-pld | 1.25 → 2.00 | +60.0% |" in report
    assert "| oilbird[sem_layer=0] | 2.00 | -20.0% |" in report
    assert "| oilbird | 16.7% | 50% | 20.0% | 1.00 | 0.00 | 1.00 |" in report


def test_fly_rows_read_lossy_in_the_comparison_table(tmp_path):
    run = tmp_path / "fly"
    run.mkdir()
    records = []
    for rid in ("r0", "r1"):
        records.append(dict(method="ar", request_id=rid, new_tokens=10, forwards=10, wall_s=1.0,
                            audit=dict(lossless=True)))
        records.append(dict(method="draft+fly", request_id=rid, new_tokens=10, forwards=3, wall_s=0.5,
                            audit=None, lossy=True, forgiven_positions=[2], differs=dict(tokens=1, first=2)))
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    table = comparison_table([load_run(run)])
    assert "| draft+fly | 3.33 | 2.00x [2.00–2.00] | LOSSY (FLy) |" in table and "| ar | 1.00 | 1.00x | 2/2 |" in table
