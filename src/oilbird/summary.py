"""One benchmark run's records pooled into one row per method.

Contract:
- Input: the records of `oilbird bench` (one per request and method, see `bench.py`), in serving
  order. Output: rows (dicts) in the order of the methods given, each pooled over its records:
  τ = Σ committed / Σ verification forwards; tokens/s = Σ tokens / Σ wall seconds; speedup =
  tokens/s ÷ the same run's `ar` tokens/s (decode speedup: the same with the prefill left out),
  with `speedup_interval`, its 90% paired bootstrap interval over the requests
  (oilbird/intervals.py). The last row that is neither the reference nor `ar` (the method under
  test: the last in `--methods`) also carries `ratios`: its tokens/s over each other method's,
  with the same kind of interval.
- Time shares are of the decode cycle (propose + forward + observe + verifier bookkeeping):
  `drafter_share` = the drafter's own time (`propose`, and `observe`, where it harvests into its
  pools and stores), `bookkeeping_share` = the verifier's mask, walk and cache compaction plus
  the loop's accounting. Records written before observe was timed apart (no `observe_s`) only
  give their sum, `overhead_share`; their split shares are None.
- The audit: `lossless` of `audited` requests token-identical to the greedy reference, with each
  divergence; `audit_failures` lists the strict (non-FLy) rows that diverged: a failed run.
- Against `ar`, the same run's greedy decoding on the same kernels and dtype (trees of
  `ForwardConfig.wide_rows` nodes or more may run the prefill kernel): `ar_identical` of
  `ar_compared` requests whose output equals `ar`'s, and where the first ones differ
  (`ar_divergences`). The audit compares with transformers' kernels, so where the reference's
  logits tie (bfloat16 ties often) `ar` itself can differ from it; this count says whether
  speculation changed anything over our own greedy decoding. Strict greedy rows only.
- Sampled runs (temperature > 0) have no token-for-token reference; their rows carry the
  distribution check instead (`dist_z` over `dist_n` positions, oilbird/sampling.py), and a
  row with |z| > 4 is a failure too.
"""

from __future__ import annotations

from oilbird.audit import first_difference
from oilbird.intervals import per_request, ratio_interval
from oilbird.sampling import Z_FAIL, check_z

REFERENCE = "hf-greedy"
"""The audit's reference run (transformers generate(do_sample=False)), reported as a row for context."""


def cycle_times(record: dict) -> dict | None:
    """Seconds of a record's decode cycle by part; None for runs without the split (hf-pld).

    Returns:
        {'drafter', 'forward', 'bookkeeping', 'overhead', 'cycle'}; 'drafter' and
        'bookkeeping' are None for records written before `observe` was timed apart.
    """
    if record.get("forward_s") is None:
        return None
    forward = record["forward_s"]
    if "observe_s" in record:
        drafter = record["propose_s"] + record["observe_s"]
        bookkeeping = record["bookkeeping_s"]
        return dict(drafter=drafter, forward=forward, bookkeeping=bookkeeping,
                    overhead=drafter + bookkeeping, cycle=drafter + forward + bookkeeping)
    overhead = (record.get("draft_s") or 0.0) + (record.get("bookkeeping_s") or 0.0)  # older records
    return dict(drafter=None, forward=forward, bookkeeping=None, overhead=overhead, cycle=overhead + forward)


def _time_shares(recs: list[dict]) -> dict:
    times = [cycle_times(r) for r in recs]
    if not recs or any(t is None for t in times):
        return dict(drafter_share=None, bookkeeping_share=None, overhead_share=None, cycle_s=None)
    cycle = sum(t["cycle"] for t in times)

    def share(part: str) -> float | None:
        if not cycle or any(t[part] is None for t in times):
            return None
        return sum(t[part] for t in times) / cycle

    return dict(drafter_share=share("drafter"), bookkeeping_share=share("bookkeeping"),
                overhead_share=share("overhead"), cycle_s=cycle)


def _audit(recs: list[dict]) -> dict:
    audited = [r for r in recs if r.get("audit") is not None]
    return dict(audited=len(audited), lossless=sum(r["audit"]["lossless"] for r in audited),
                divergences=[dict(request_id=r["request_id"], **r["audit"])
                             for r in audited if not r["audit"]["lossless"]])


def _sources(recs: list[dict]) -> dict:
    """Per-source shares of accepted draft tokens (bonus tokens excluded)."""
    drafts = sum(r.get("accepted_drafts") or 0 for r in recs)
    out = dict(accepted_drafts=drafts, source_share={}, sole_source_share={})
    for key, shares in (("accepted_sources", out["source_share"]), ("sole_sources", out["sole_source_share"])):
        if not drafts:
            continue
        for r in recs:
            for source, count in (r.get(key) or {}).items():
                shares[source] = shares.get(source, 0) + count
        for source in shares:
            shares[source] /= drafts
    return out


def _grades(recs: list[dict]) -> dict:
    graded = [r["correct"] for r in recs if r.get("correct") is not None]
    return dict(graded=len(graded), correct=sum(graded),
                accuracy=sum(graded) / len(graded) if graded else None,
                graded_ids={r["request_id"]: r["correct"] for r in recs if r.get("correct") is not None})


def _lossy(recs: list[dict]) -> dict:
    """FLy rows: how far from greedy decoding the loose rule took the outputs."""
    lossy = [r for r in recs if r.get("lossy")]
    if not lossy:
        return dict(lossy=False)
    compared = [r["differs"] for r in lossy if r.get("differs")]
    return dict(lossy=True, forgiven=sum(len(r.get("forgiven_positions") or []) for r in lossy),
                compared=len(compared), requests_differing=sum(d["tokens"] > 0 for d in compared),
                tokens_differing=sum(d["tokens"] for d in compared))


def _sampled(recs: list[dict]) -> dict:
    """Sampled rows: the pooled distribution check (oilbird/sampling.py `calibration_terms`)."""
    checks = [r["sample_check"] for r in recs if (r.get("sample_check") or [0, 0, 0])[2]]
    if not checks:
        return dict(dist_n=0)
    deviation, variance = sum(c[0] for c in checks), sum(c[1] for c in checks)
    z = check_z(deviation, variance)
    return dict(dist_n=int(sum(c[2] for c in checks)), dist_z=z,
                dist_failed=z is not None and abs(z) > Z_FAIL)


def _row(method: str, recs: list[dict]) -> dict:
    tokens = sum(r["new_tokens"] for r in recs)
    forwards = sum(r["forwards"] for r in recs)
    wall = sum(r["wall_s"] for r in recs)
    row = dict(method=method, requests=len(recs), new_tokens=tokens, forwards=forwards,
               tau=tokens / forwards if forwards else 0.0,
               tokens_per_s=tokens / wall if wall else 0.0, wall_s=wall)
    row.update(_audit(recs), **_time_shares(recs), **_sources(recs), **_grades(recs), **_lossy(recs),
               **_sampled(recs))
    prefill, prompt = sum(r.get("prefill_s") or 0.0 for r in recs), sum(r.get("prompt_len") or 0 for r in recs)
    row["prefill_share"] = prefill / wall if wall and "prefill_s" in recs[0] else None
    row["prompt_cached"] = sum(r.get("prefix_reused") or 0 for r in recs) / prompt if prompt else None
    row["semantic"] = semantic_stats(recs, row["cycle_s"])
    # Decode phase only: the prefill is identical across methods and dilutes the ratio.
    row["decode_tokens_per_s"] = tokens / row["cycle_s"] if row["cycle_s"] else None
    return row


def _ratio(a, b) -> float | None:
    return a / b if a is not None and b else None


def _against_ar(row: dict, base: dict | None) -> None:
    """Speedups, accuracy recovery and the request-by-request answer changes against `ar`."""
    base = base or {}
    row["speedup"] = _ratio(row["tokens_per_s"], base.get("tokens_per_s"))
    row["decode_speedup"] = _ratio(row["decode_tokens_per_s"], base.get("decode_tokens_per_s"))
    # Recovery: accuracy relative to strict verification, whose output is greedy decoding's ('ar').
    row["recovery"] = _ratio(row["accuracy"], base.get("accuracy"))
    # On a few dozen questions the ratio is noisy; the answers turned wrong (lost) or right
    # (gained) request by request say more.
    theirs = base.get("graded_ids") or {}
    both = [i for i in row["graded_ids"] if i in theirs]
    row["lost"] = sum(theirs[i] and not row["graded_ids"][i] for i in both) if both else None
    row["gained"] = sum(row["graded_ids"][i] and not theirs[i] for i in both) if both else None


def summarize(records: list[dict], methods: list[str]) -> list[dict]:
    """Pool the records of each method: τ, tokens/s, speedup vs 'ar', audit, time shares.

    Args:
        records: a run's records (any subset: a category, the first N requests).
        methods: the row labels to summarize, in table order.

    Returns:
        One row per method (see the module docstring for the fields).
    """
    rows = [_row(method, [r for r in records if r["method"] == method]) for method in methods]
    base = next((r for r in rows if r["method"] == "ar"), None)
    times = {method: per_request(records, method) for method in methods}
    for row in rows:
        _against_ar(row, base)
        row["speedup_interval"] = (ratio_interval(times[row["method"]], times["ar"])
                                   if base is not None and row is not base else None)
    _headline_ratios(rows, times)
    _against_ar_outputs(rows, records)
    for row in rows:  # per-request grades were only needed for the pairing: keep summaries small
        del row["graded_ids"], row["cycle_s"]
    return rows


def _headline_ratios(rows: list[dict], times: dict[str, dict]) -> None:
    """Give the method under test (the last row that is neither the reference nor `ar`) its
    tokens/s over every other such row's, each with its paired interval."""
    tested = [r for r in rows if r["method"] not in (REFERENCE, "ar")]
    if len(tested) < 2:
        return
    head = tested[-1]
    head["ratios"] = [dict(method=other["method"], ratio=_ratio(head["tokens_per_s"], other["tokens_per_s"]),
                           interval=ratio_interval(times[head["method"]], times[other["method"]]))
                      for other in tested[:-1]]


def _against_ar_outputs(rows: list[dict], records: list[dict]) -> None:
    """Give each strict greedy row (not the reference, `ar`, FLy's or a sampled one) how many of
    its outputs equal `ar`'s on the same requests, and where the first three differ."""
    ar = {r["request_id"]: r["output_ids"] for r in records if r["method"] == "ar" and "output_ids" in r}
    for row in rows:
        if not ar or row["method"] in (REFERENCE, "ar") or row.get("lossy") or row.get("dist_n"):
            continue
        compared, divergences = 0, []
        for r in records:
            if r["method"] == row["method"] and r["request_id"] in ar and "output_ids" in r:
                compared += 1
                at = first_difference(r["output_ids"], ar[r["request_id"]])
                if at is not None:
                    divergences.append(dict(request_id=r["request_id"], position=at))
        row["ar_compared"], row["ar_identical"] = compared, compared - len(divergences)
        row["ar_divergences"] = divergences[:3]


def audit_failures(rows: list[dict]) -> list[dict]:
    """The strict rows (not the reference, not FLy's lossy ones) with a divergent output."""
    return [r for r in rows if r["method"] != REFERENCE and not r.get("lossy")
            and (r["audited"] and r["lossless"] < r["audited"] or r.get("dist_failed"))]


def semantic_stats(recs: list[dict], cycle_s: float | None) -> dict | None:
    """Pooled semantic-source measurements of a method (None for methods without the source)."""
    stats = [r["drafter_stats"] for r in recs if (r.get("drafter_stats") or {}).get("cycles") is not None
             and "retrieve_s" in r["drafter_stats"]]
    if not stats:
        return None
    cycles = sum(s["cycles"] for s in stats)

    def per_cycle_ms(key: str) -> float:
        return 1e3 * sum(s[key] for s in stats) / cycles if cycles else 0.0

    upkeep = sum(s["retrieve_s"] + s["merge_s"] + s["harvest_s"] for s in stats)
    return dict(cycles=cycles, fired_share=sum(s["fired"] for s in stats) / cycles if cycles else 0.0,
                retrieve_ms_per_cycle=per_cycle_ms("retrieve_s"), merge_ms_per_cycle=per_cycle_ms("merge_s"),
                harvest_ms_per_cycle=per_cycle_ms("harvest_s"),
                share_of_cycle=upkeep / cycle_s if cycle_s else 0.0,
                paid_nodes=sum(s["sem_paid"] for s in stats),
                paid_accepted=sum(s["sem_paid_accepted"] for s in stats),
                store_records=stats[-1]["store_records"], bytes_per_record=stats[-1]["bytes_per_record"],
                theta_end=stats[-1].get("theta"), lists=any(s.get("lists") for s in stats),
                faiss=any(s.get("faiss") for s in stats))  # runs before stop 42 searched by FAISS HNSW
