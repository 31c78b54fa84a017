"""Pooling a run's records into rows (oilbird.summary)."""


def test_accuracy_is_also_compared_with_ar_request_by_request():
    from oilbird.summary import summarize

    def rec(method, request, correct):
        return dict(method=method, request_id=request, new_tokens=4, forwards=2, wall_s=1.0, correct=correct)

    outcomes = {"ar": [True, True, False, False], "fly": [True, False, True, True]}
    records = [rec(m, f"q{i}", c) for m, cs in outcomes.items() for i, c in enumerate(cs)]
    rows = {r["method"]: r for r in summarize(records, ["ar", "fly"])}
    assert (rows["fly"]["accuracy"], rows["fly"]["recovery"]) == (0.75, 1.5)
    assert (rows["fly"]["lost"], rows["fly"]["gained"]) == (1, 2)  # q1 lost; q2, q3 gained
    assert (rows["ar"]["lost"], rows["ar"]["gained"]) == (0, 0)


def test_audit_failures_are_strict_rows_with_a_divergent_output():
    from oilbird.summary import audit_failures, summarize

    def rec(method, lossless, **extra):
        return dict(method=method, request_id="q", new_tokens=4, forwards=2, wall_s=1.0,
                    audit=None if lossless is None else dict(lossless=lossless), **extra)

    records = [rec("hf-greedy", None), rec("ar", True), rec("pld", False), rec("sam", True),
               rec("pld+fly", None, lossy=True)]
    rows = summarize(records, ["hf-greedy", "ar", "pld", "sam", "pld+fly"])
    assert [r["method"] for r in audit_failures(rows)] == ["pld"]


def test_cycle_times_count_observe_as_drafter_time():
    from oilbird.summary import cycle_times

    times = cycle_times(dict(propose_s=0.1, forward_s=0.5, observe_s=0.3, bookkeeping_s=0.1))
    assert times["drafter"] == 0.1 + 0.3 and times["bookkeeping"] == 0.1
    assert abs(times["cycle"] - 1.0) < 1e-9
    assert cycle_times(dict(output_ids=[1], forwards=1, wall_s=1.0)) is None  # hf-pld: no split
