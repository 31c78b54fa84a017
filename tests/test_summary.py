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


def test_strict_rows_count_their_outputs_equal_to_ars():
    from oilbird.summary import summarize
    from oilbird.tables import ar_identity_lines

    def rec(method, request, output, **extra):
        return dict(method=method, request_id=request, new_tokens=len(output), forwards=2, wall_s=1.0,
                    output_ids=output, **extra)

    records = [rec("hf-greedy", "q0", [1, 2, 3]), rec("hf-greedy", "q1", [4, 5]),
               rec("ar", "q0", [1, 2, 3]), rec("ar", "q1", [4, 6]),  # ar itself differs from the reference
               rec("pld", "q0", [1, 2, 3]), rec("pld", "q1", [4, 6]),
               rec("sam", "q0", [1, 2]), rec("sam", "q1", [4, 6]),  # stopped one token early on q0
               rec("pld+fly", "q0", [1, 9, 3], lossy=True)]
    rows = {r["method"]: r for r in summarize(records, ["hf-greedy", "ar", "pld", "sam", "pld+fly"])}
    assert (rows["pld"]["ar_identical"], rows["pld"]["ar_compared"], rows["pld"]["ar_divergences"]) == (2, 2, [])
    assert (rows["sam"]["ar_identical"], rows["sam"]["ar_divergences"]) == (1, [dict(request_id="q0", position=2)])
    assert all("ar_compared" not in rows[m] for m in ("hf-greedy", "ar", "pld+fly"))
    line = ar_identity_lines(list(rows.values()))[-1]
    assert "pld 2/2; sam 1/2 (first: q0, token 2)" in line
    assert ar_identity_lines(summarize(records[:2], ["hf-greedy"])) == []  # no ar row: no line
