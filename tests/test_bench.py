"""The benchmark harness on a few real requests: records, pooled τ, audit and JSON output."""

import json

import pytest

from oilbird.bench import BenchConfig, run_bench


@pytest.mark.heavy(75)
def test_bench_runs_methods_side_by_side_and_audits(smol, tmp_path):
    config = BenchConfig(dataset="api-bank/level-1-api", limit=3, max_new_tokens=16,
                         methods="pld,hf-pld", warmup=1)
    summary = run_bench(smol, config, out_dir=tmp_path, progress=False)
    rows = {r["method"]: r for r in summary["rows"]}
    assert list(rows) == ["hf-greedy", "ar", "pld", "hf-pld"]  # ar added as the baseline
    for method in ("ar", "pld", "hf-pld"):
        assert rows[method]["lossless"] == rows[method]["audited"] == 3, rows[method]["divergences"]
        assert rows[method]["speedup"] > 0
    assert rows["ar"]["tau"] == 1.0 and rows["ar"]["speedup"] == 1.0
    assert rows["pld"]["tau"] >= 1.0
    # Attribution: every accepted draft of PLD carries the "pld" tag and nothing else.
    assert rows["pld"]["accepted_drafts"] >= rows["pld"]["new_tokens"] - rows["pld"]["forwards"]
    if rows["pld"]["accepted_drafts"]:
        assert rows["pld"]["source_share"] == rows["pld"]["sole_source_share"] == {"pld": 1.0}
    records = [json.loads(line) for line in (tmp_path / "records.jsonl").read_text().splitlines()]
    assert len(records) == 3 * 4
    pld = [r for r in records if r["method"] == "pld"]
    assert sum(r["new_tokens"] for r in pld) / sum(r["forwards"] for r in pld) == rows["pld"]["tau"]
    for r in pld:  # per request: committed tokens per forward add up to the output
        assert sum(r["committed_per_forward"]) == r["new_tokens"] == len(r["output_ids"])
        assert len(r["nodes_per_forward"]) == r["forwards"]
    assert json.loads((tmp_path / "summary.json").read_text())["rows"][2]["method"] == "pld"
    assert "| pld |" in summary["table"] and "3/3" in summary["table"]


@pytest.mark.heavy(50)
def test_each_method_runs_at_each_budget_against_one_ar_and_auto_stays_lossless(smol, tmp_path):
    from oilbird.budget import BudgetConfig

    config = BenchConfig(dataset="api-bank/level-1-api", limit=2, max_new_tokens=24,
                         methods="pld,goose,sam@auto", budget="6,auto", warmup=0)
    summary = run_bench(smol, config, out_dir=tmp_path, progress=False,
                        budget_config=BudgetConfig(mode="auto", grid="1,4,12", explore_every=2))
    rows = {r["method"]: r for r in summary["rows"]}
    assert list(rows) == ["hf-greedy", "ar", "pld@6", "pld@auto", "goose@6", "goose@auto", "sam@auto"]
    for label in ("pld@6", "pld@auto", "goose@6", "goose@auto", "sam@auto"):
        assert rows[label]["lossless"] == rows[label]["audited"] == 2, rows[label]["divergences"]
    records = [json.loads(line) for line in (tmp_path / "records.jsonl").read_text().splitlines()]
    fixed = [n for r in records if r["method"] == "goose@6" for n in r["nodes_per_forward"]]
    auto = [n for r in records if r["method"] == "goose@auto" for n in r["nodes_per_forward"]]
    assert max(fixed) <= 6
    assert max(auto) <= 12 and auto[0] > 1  # the grid's cap; the first tree probes the largest size
    assert summary["budget_curve"]["points"].keys() >= {"1", "4", "12"}


def test_one_budget_keeps_plain_method_names():
    config = BenchConfig(methods="pld,hf-pld", budget="60")
    assert config.variants() == [("ar", "ar", "60"), ("pld", "pld", "60"), ("hf-pld", "hf-pld", "60")]
    config = BenchConfig(methods="pld,hf-pld", budget="60,auto")
    assert [v[0] for v in config.variants()] == ["ar", "pld@60", "pld@auto", "hf-pld"]
    config = BenchConfig(methods="pld@auto,goose", budget="60")
    assert config.variants()[1:] == [("pld@auto", "pld", "auto"), ("goose", "goose", "60")]


def test_ctrl_c_keeps_and_summarizes_the_requests_that_finished(smol, tmp_path, monkeypatch):
    import oilbird.bench as bench

    calls = []

    def compare_then_interrupt(got, ref):  # the user presses Ctrl-C during the second request
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_compare(got, ref)

    real_compare = bench.compare
    monkeypatch.setattr(bench, "compare", compare_then_interrupt)
    config = BenchConfig(dataset="api-bank/level-1-api", limit=3, max_new_tokens=4, methods="pld",
                         warmup=0)
    summary = run_bench(smol, config, out_dir=tmp_path, progress=False)
    assert summary["interrupted"] and summary["requests_served"] == 1
    records = [json.loads(line) for line in (tmp_path / "records.jsonl").read_text().splitlines()]
    assert {r["request_id"] for r in records} == {"level-1-api/0"}  # no half-served request
    assert json.loads((tmp_path / "summary.json").read_text())["interrupted"] is True


@pytest.mark.heavy(40)
def test_fly_rows_are_labeled_lossy_and_left_out_of_the_audit(smol, tmp_path):
    config = BenchConfig(dataset="api-bank/level-1-api", limit=2, max_new_tokens=16, warmup=0, budget="16",
                         methods="draft[model=self:4;k=6],draft+fly[model=self:4;k=6;fly_theta=0;fly_window=0]")
    summary = run_bench(smol, config, out_dir=tmp_path, progress=False)
    rows = {r["method"]: r for r in summary["rows"]}
    strict, fly = rows["draft[model=self:4;k=6]"], rows["draft+fly[model=self:4;k=6;fly_theta=0;fly_window=0]"]
    assert strict["lossless"] == strict["audited"] == 2 and not strict["lossy"]
    assert fly["lossy"] and fly["audited"] == 0 and fly["compared"] == 2 and fly["forgiven"] > 0
    assert fly["tau"] > strict["tau"]  # every draft accepted
    assert "LOSSY" in summary["table"]
    records = [json.loads(line) for line in (tmp_path / "records.jsonl").read_text().splitlines()]
    lossy = [r for r in records if r["method"].startswith("draft+fly")]
    assert all(r["lossy"] and r["audit"] is None and r["differs"]["against"] == "hf-greedy" for r in lossy)
    # Without the audit's reference, FLy outputs are compared with ar's (greedy decoding too).
    unaudited = run_bench(smol, BenchConfig(dataset="api-bank/level-1-api", limit=1, max_new_tokens=16,
                                            warmup=0, budget="16", audit=False,
                                            methods="draft+fly[model=self:4;k=6;fly_theta=0;fly_window=0]"),
                          out_dir=tmp_path / "unaudited", progress=False)
    assert unaudited["rows"][1]["compared"] == 1
    records = [json.loads(line) for line in (tmp_path / "unaudited/records.jsonl").read_text().splitlines()]
    ar, fly = records
    assert fly["differs"]["against"] == "ar"
    assert fly["differs"]["tokens"] == sum(a != b for a, b in zip(ar["output_ids"], fly["output_ids"])) + abs(
        len(ar["output_ids"]) - len(fly["output_ids"]))


def test_answers_of_gradable_requests_are_graded_per_method(smol):
    config = BenchConfig(dataset="spec-bench:math_reasoning", limit=2, max_new_tokens=8, warmup=0,
                         methods="pld,pld+fly[fly_theta=0;fly_window=0]", budget="8")
    summary = run_bench(smol, config, progress=False)
    rows = {r["method"]: r for r in summary["rows"]}
    assert rows["ar"]["graded"] == rows["pld"]["graded"] == 2
    assert rows["pld"]["correct"] == rows["ar"]["correct"]  # lossless: the same answers
    assert "Accuracy of the answers" in summary["table"]
    assert run_bench(smol, BenchConfig(dataset="spec-bench:writing", limit=1, max_new_tokens=4, warmup=0,
                                       methods="pld"), progress=False)["rows"][1]["graded"] == 0


@pytest.mark.heavy(45)
def test_a_sampled_run_replaces_the_audit_with_the_distribution_check(smol, tmp_path):
    import pytest

    from oilbird.sampling import SamplingConfig
    from oilbird.summary import audit_failures
    from oilbird.tables import audit_cell

    sampling = SamplingConfig(temperature=0.7, top_p=0.95, seed=5)
    config = BenchConfig(dataset="api-bank/level-1-api", limit=3, max_new_tokens=32,
                         methods="pld,sam", warmup=0, sampling=sampling)
    summary = run_bench(smol, config, out_dir=tmp_path, progress=False)
    rows = {r["method"]: r for r in summary["rows"]}
    assert list(rows) == ["ar", "pld", "sam"]  # no greedy reference: nothing to compare token for token
    for row in rows.values():
        assert row["audited"] == 0 and row["dist_n"] == row["new_tokens"] > 0
        assert abs(row["dist_z"]) < 4 and audit_cell(row).startswith("dist z=")
    assert not audit_failures(summary["rows"]) and summary["config"]["sampling"]["temperature"] == 0.7
    # A biased sampler fails the check: the same rows with every drawn token made the likeliest.
    biased = dict(rows["pld"], dist_z=9.0, dist_failed=True)
    assert audit_cell(biased).startswith("FAILED") and audit_failures([biased]) == [biased]
    with pytest.raises(ValueError, match="hf-pld"):
        BenchConfig(methods="pld,hf-pld", sampling=sampling)
