"""One run's Markdown tables (oilbird.tables), re-made from records."""

import json


def test_report_remakes_tables_from_records(tmp_path):
    from oilbird.tables import report

    lines = []
    for i, (method, tokens, forwards) in enumerate([("ar", 10, 10), ("pld", 10, 4)] * 2):
        lines.append(json.dumps(dict(
            method=method, request_id=f"r{i // 2}", category="x" if i < 2 else "y",
            new_tokens=tokens, forwards=forwards, wall_s=1.0 if method == "ar" else 0.5,
            draft_s=0.0, forward_s=0.4, bookkeeping_s=0.1, audit=dict(lossless=True))))
    (tmp_path / "records.jsonl").write_text("\n".join(lines) + "\n")
    table = report(tmp_path)
    assert "| pld | 2 | 20 | 8 | 2.50 | 20.0 | 2.00x |" in table
    by_category = report(tmp_path, by_category=True)
    assert "### x (1 requests)" in by_category and "### y (1 requests)" in by_category
    assert "| pld | 1 | 10 | 4 | 2.50 |" in report(tmp_path, first=1)
    # A run still in progress has no summary yet: its settings come from config.json.
    (tmp_path / "config.json").write_text(json.dumps(dict(dataset="humaneval", max_new_tokens=99)))
    assert "humaneval, 99 new tokens max" in report(tmp_path)


def _record(method, request, audit, **times):
    return dict(method=method, request_id=request, category=None, new_tokens=10, forwards=5, wall_s=1.0,
                audit=audit, **times)


SPLIT = dict(propose_s=0.1, forward_s=0.6, observe_s=0.1, bookkeeping_s=0.2)


def test_a_divergent_strict_method_reads_failed_and_the_table_says_so(tmp_path):
    from oilbird.tables import report

    diverged = dict(lossless=False, divergence=7, expected=11, got=12, margin=0.03)
    records = [_record("hf-greedy", "r0", None), _record("ar", "r0", dict(lossless=True), **SPLIT),
               _record("sam", "r0", diverged, **SPLIT),
               _record("pld+fly", "r0", None, lossy=True, differs=dict(tokens=2, first=3, against="hf-greedy"), **SPLIT)]
    (tmp_path / "records.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    table = report(tmp_path)
    assert "| sam | 1 | 10 | 5 | 2.00 | 10.0 | 1.00x | – | 1.00x | FAILED 0/1 |" in table
    assert "| ar | 1 | 10 | 5 | 2.00 | 10.0 | 1.00x | – | 1.00x | 1/1 |" in table
    assert "LOSSY: 1/1 differ" in table  # FLy's lossy outputs are not an audit failure
    failures = [line for line in table.splitlines() if line.startswith("AUDIT FAILED")]
    assert failures == ["AUDIT FAILED: sam: 1 of 1 requests differ from greedy decoding (first: r0, token 7, "
                        "expected 11, got 12, reference margin 0.03)"]


def test_drafter_time_includes_observe_and_bookkeeping_is_the_verifiers(tmp_path):
    from oilbird.tables import report

    records = [_record("ar", "r0", dict(lossless=True), **SPLIT), _record("pld", "r0", dict(lossless=True), **SPLIT)]
    (tmp_path / "records.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    table = report(tmp_path)
    # drafter = (propose 0.1 + observe 0.1) / cycle 1.0; bookkeeping = 0.2 / 1.0
    assert "| pld | 1 | 10 | 5 | 2.00 | 10.0 | 1.00x | – | 1.00x | 1/1 | 20.0% | 20.0% |" in table
    assert "drafter % = the drafter's propose and observe" in table
    # Records written before observe was timed apart cannot be split: dashes, not wrong numbers.
    old = [_record("ar", "r0", dict(lossless=True), draft_s=0.1, forward_s=0.6, bookkeeping_s=0.3)]
    (tmp_path / "records.jsonl").write_text(json.dumps(old[0]) + "\n")
    assert "| ar | 1 | 10 | 5 | 2.00 | 10.0 | 1.00x | – | 1.00x | 1/1 | – | – |" in report(tmp_path)


def test_a_damaged_records_file_is_a_clear_error(tmp_path):
    import pytest

    from oilbird.errors import DatasetError
    from oilbird.tables import report

    good = json.dumps(_record("ar", "r0", dict(lossless=True), **SPLIT))
    (tmp_path / "records.jsonl").write_text(good + "\nnot json\n")
    with pytest.raises(DatasetError, match=r"records.jsonl:2 is not JSON"):
        report(tmp_path)
    (tmp_path / "records.jsonl").write_text(good + '\n{"method": "ar"}\n')
    with pytest.raises(DatasetError, match=r"records.jsonl:2 is not a benchmark record \(missing request_id"):
        report(tmp_path)


def test_report_sets_the_method_under_test_against_every_other(tmp_path):
    import pytest

    from oilbird.errors import DatasetError
    from oilbird.tables import report

    walls = {"ar": 1.0, "pld": 0.5, "sam": 0.25}  # tokens/s 10, 20, 40 on every request
    lines = [json.dumps(dict(method=m, request_id=f"r{i}", category=None, new_tokens=10, forwards=5, wall_s=w,
                             audit=dict(lossless=True)))
             for i in range(3) for m, w in walls.items()]
    (tmp_path / "records.jsonl").write_text("\n".join(lines) + "\n")
    assert "sam / pld 2.00 (2.00–2.00)" in report(tmp_path)  # the last method; `ar` is in the speedup column
    table = report(tmp_path, under_test="pld")
    assert "pld / sam 0.50 (0.50–0.50)" in table and "sam / pld" not in table
    assert table.index("| sam |") < table.index("| pld |")  # its row goes last
    with pytest.raises(DatasetError, match="no records of 'goose'"):
        report(tmp_path, under_test="goose")
