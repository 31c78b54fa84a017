"""The benchmark harness on a few real requests: records, pooled τ, audit and JSON output."""

import json

import pytest

from oilbird.bench import BenchConfig, run_bench
from oilbird.errors import ConfigError


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


def test_report_remakes_tables_from_records(tmp_path):
    from oilbird.bench import report

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


def test_method_specs_carry_config_overrides():
    from oilbird.bench import build_drafter, split_methods

    config = BenchConfig(methods="goose,oilbird[sem_entry_budget=0;sem_floor=false]@auto,oilbird", budget="60")
    assert [v[0] for v in config.variants()] == [
        "ar", "goose", "oilbird[sem_entry_budget=0;sem_floor=false]@auto", "oilbird"]
    drafter = build_drafter("oilbird[sem_entry_budget=0;sem_floor=false]", {})
    assert drafter.config.sem_entry_budget == 0 and drafter.config.sem_floor is False
    assert build_drafter("oilbird", {}).config.sem_entry_budget > 0
    assert split_methods("a[x=1,2],b") == ["a[x=1,2]", "b"]


@pytest.mark.parametrize("methods, complaint", [
    ("oilbird[sem_nothing=1]", "no config field 'sem_nothing'"),
    ("oilbird[sem_top_k=many]", "expected int"),
    ("oilbird[sem_top_k=0]", "sem_top_k"),
    ("oilbird[sem_top_k]", "not field=value"),
    ("hf-pld[x=1]", "only drafters take config overrides"),
])
def test_bad_method_specs_say_what_is_wrong(methods, complaint):
    with pytest.raises(ConfigError, match=complaint):
        BenchConfig(methods=methods).method_list()


def test_ctrl_c_keeps_and_summarises_the_requests_that_finished(smol, tmp_path, monkeypatch):
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


def test_fly_specs_split_into_the_drafter_and_the_rule():
    from oilbird.bench import fly_config, parse_spec
    from oilbird.fly import FlyConfig

    assert parse_spec("draft+fly[k=10;fly_window=4]") == ("draft", {"k": "10"})
    assert fly_config("draft+fly[k=10;fly_window=4;fly_entropy=normalized]") == FlyConfig(window=4, entropy="normalized")
    assert fly_config("pld+fly") == FlyConfig() and fly_config("pld") is None
    for spec, message in [("pld[fly_window=4]", "need the FLy rule"), ("pld+fly[fly_gate=1]", "no config field"),
                          ("pld+fly[fly_window=x]", "expected int"), ("pld+fly[fly_entropy=renyi]", "entropy")]:
        with pytest.raises(ConfigError, match=message):
            fly_config(spec)
    with pytest.raises(ConfigError, match="only drafters"):
        BenchConfig(methods="hf-pld+fly").method_list()
    assert BenchConfig(methods="pld+fly[fly_theta=0.6],pld").method_list() == ["ar", "pld+fly[fly_theta=0.6]", "pld"]


def test_differences_count_what_a_lossy_output_changed():
    from oilbird.audit import differences

    assert differences([1, 2, 3], [1, 2, 3]).tokens == 0 and differences([1, 2, 3], [1, 2, 3]).first is None
    d = differences([1, 9, 3, 4], [1, 2, 3])
    assert (d.tokens, d.first) == (2, 1)
    assert differences([1, 2], [1, 2, 3]).first == 2


def test_fly_rows_are_labelled_lossy_and_left_out_of_the_audit(smol, tmp_path):
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


def test_accuracy_is_also_compared_with_ar_request_by_request():
    from oilbird.bench import summarize

    def rec(method, request, correct):
        return dict(method=method, request_id=request, new_tokens=4, forwards=2, wall_s=1.0, correct=correct)

    outcomes = {"ar": [True, True, False, False], "fly": [True, False, True, True]}
    records = [rec(m, f"q{i}", c) for m, cs in outcomes.items() for i, c in enumerate(cs)]
    rows = {r["method"]: r for r in summarize(records, ["ar", "fly"])}
    assert (rows["fly"]["accuracy"], rows["fly"]["recovery"]) == (0.75, 1.5)
    assert (rows["fly"]["lost"], rows["fly"]["gained"]) == (1, 2)  # q1 lost; q2, q3 gained
    assert (rows["ar"]["lost"], rows["ar"]["gained"]) == (0, 0)
