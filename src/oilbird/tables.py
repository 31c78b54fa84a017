"""One benchmark run as Markdown: the table `oilbird bench` prints and `oilbird report` re-makes.

Contract:
- `format_table(rows, config)`: a row per method (τ, tokens/s, speedups, audit, time shares),
  then the accuracy, per-source and semantic-source lists where the run has them, then a
  footnote that defines every column. A strict row whose audit found a divergence reads
  `FAILED n/m` and the table ends with an `AUDIT FAILED` line naming the first divergence, so a
  failed run never passes for a good one, whoever re-reads it.
- `read_records(run_dir)` and `report(run_dir, ...)` re-make the tables from a run's
  records.jsonl (all requests, the first N, or one table per category).
Cross-run tables are `results.py`'s job.
"""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

from oilbird.errors import DatasetError
from oilbird.methods import FLY
from oilbird.summary import REFERENCE, audit_failures, summarize


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def _times(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}x"


def audit_cell(row: dict) -> str:
    """The 'lossless' column: reference, LOSSY (FLy), n/m, FAILED n/m, or not audited."""
    if row["method"] == REFERENCE:
        return "reference"
    if row.get("lossy"):  # never counted as lossless: how many requests left greedy's output
        return f"LOSSY: {row['requests_differing']}/{row['compared']} differ" if row.get("compared") else "LOSSY"
    if row.get("dist_n"):  # sampled: the distribution check, never called lossless token for token
        z = row["dist_z"]
        cell = f"dist z={z:+.1f} ({row['dist_n']} pos.)" if z is not None else "dist: no spread"
        return f"FAILED {cell}" if row.get("dist_failed") else cell
    if not row["audited"]:
        return "not audited"
    cell = f"{row['lossless']}/{row['audited']}"
    return cell if row["lossless"] == row["audited"] else f"FAILED {cell}"


def audit_failure_lines(rows: list[dict]) -> list[str]:
    """One line per strict method whose output diverged from greedy decoding (empty: all good)."""
    lines = []
    for row in audit_failures(rows):
        if row.get("dist_failed"):
            lines.append(f"DISTRIBUTION CHECK FAILED: {row['method']}: z = {row['dist_z']:+.1f} over "
                         f"{row['dist_n']} sampled positions (|z| > 4: not the target's distribution)")
            continue
        first = row["divergences"][0]
        lines.append(f"AUDIT FAILED: {row['method']}: {row['audited'] - row['lossless']} of {row['audited']} "
                     f"requests differ from greedy decoding (first: {first['request_id']}, token "
                     f"{first['divergence']}, expected {first['expected']}, got {first['got']}, "
                     f"reference margin {first['margin']})")
    return lines


def ar_identity_lines(rows: list[dict]) -> list[str]:
    """The line saying how many outputs of each strict method equal `ar`'s (empty without `ar`)."""
    compared = [r for r in rows if r.get("ar_compared")]
    if not compared:
        return []
    parts = []
    for r in compared:
        part = f"{r['method']} {r['ar_identical']}/{r['ar_compared']}"
        if r["ar_divergences"]:
            first = r["ar_divergences"][0]
            part += f" (first: {first['request_id']}, token {first['position']})"
        parts.append(part)
    return ["", "Outputs identical to `ar`'s (our own greedy decoding, same model and dtype, steps on the "
                "same kernel; trees of --wide-rows nodes or more may round on the prefill kernel): "
                + "; ".join(parts)]


def interval_cell(x) -> str:
    """A (low, high) interval as 'low–high', or '–' when there is none."""
    return "–" if not x else f"{x[0]:.2f}–{x[1]:.2f}"


def _main_table(rows: list[dict]) -> list[str]:
    lines = ["| method | requests | tokens | forwards | τ | tokens/s | speedup vs ar | 90% interval | decode speedup "
             "| lossless | drafter % | bookkeeping % | prefill % | prompt cached % |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['method']} | {r['requests']} | {r['new_tokens']} | {r['forwards']} | "
                     f"{r['tau']:.2f} | {r['tokens_per_s']:.1f} | {_times(r['speedup'])} | "
                     f"{interval_cell(r.get('speedup_interval'))} | "
                     f"{_times(r['decode_speedup'])} | {audit_cell(r)} | "
                     f"{_pct(r['drafter_share'])} | {_pct(r['bookkeeping_share'])} | "
                     f"{_pct(r.get('prefill_share'))} | {_pct(r.get('prompt_cached'))} |")
    return lines


def _ratio_lines(rows: list[dict]) -> list[str]:
    head = next((r for r in reversed(rows) if r.get("ratios")), None)
    if head is None:
        return []
    parts = [f"{head['method']} / {x['method']} {x['ratio']:.2f} ({interval_cell(x['interval'])})"
             for x in head["ratios"] if x["ratio"] is not None]
    return ["", "The method under test against each other method, tokens/s over tokens/s (90% interval, "
                "requests resampled in pairs): " + "; ".join(parts)]


def _accuracy_lines(rows: list[dict]) -> list[str]:
    graded = [r for r in rows if r.get("graded")]
    if not graded:
        return []
    lines = ["", "Accuracy of the answers (GSM8K: the final number; HumanEval: pass@1 of its tests); "
                 "recovery = accuracy / accuracy of ar (strict verification gives greedy's output):"]
    for r in graded:
        recovery = "" if r["recovery"] is None else f", recovery {100 * r['recovery']:.1f}%"
        if r["method"] != "ar" and r.get("lost") is not None:
            recovery += f" (vs ar, request by request: {r['lost']} lost, {r['gained']} gained)"
        lines.append(f"- {r['method']}: {r['correct']}/{r['graded']} = {100 * r['accuracy']:.1f}%{recovery}")
    return lines


def _source_lines(rows: list[dict]) -> list[str]:
    shares = [r for r in rows if r.get("source_share")]
    if not shares:
        return []
    lines = ["", "Accepted draft tokens by source (share of all accepted drafts; sole = only that "
                 "source proposed it; bonus tokens excluded):"]
    for r in shares:
        parts = [f"{s} {100 * v:.1f}% (sole {100 * r['sole_source_share'].get(s, 0.0):.1f}%)"
                 for s, v in sorted(r["source_share"].items())]
        memory = r.get("memory_bytes")
        mem = f"; pool/table memory {memory / 2**20:.1f} MiB" if memory else ""
        lines.append(f"- {r['method']}: " + ", ".join(parts) + mem)
    return lines


def _semantic_lines(rows: list[dict]) -> list[str]:
    semantic = [r for r in rows if r.get("semantic")]
    if not semantic:
        return []
    lines = ["", "Semantic source (per drafting cycle; share = retrieval + merge + harvest of the "
                 "decode cycle; acceptance = accepted / paid semantic nodes):"]
    for r in semantic:
        s = r["semantic"]
        lines.append(
            f"- {r['method']}: fired in {100 * s['fired_share']:.0f}% of cycles; retrieval "
            f"{s['retrieve_ms_per_cycle']:.2f} ms, merge {s['merge_ms_per_cycle']:.2f} ms, harvest "
            f"{s['harvest_ms_per_cycle']:.2f} ms ({100 * s['share_of_cycle']:.1f}% of the cycle); "
            f"{s['paid_nodes']} nodes paid, {100 * s['paid_accepted'] / max(1, s['paid_nodes']):.1f}% "
            f"accepted; store {s['store_records']} records x {s['bytes_per_record']} B"
            + (" (inverted lists)" if s.get("lists") else "") + (" (FAISS)" if s.get("faiss") else ""))
    return lines


def footnote(config) -> str:
    """What the columns mean, for a run of `config` (a BenchConfig)."""
    return (f"{config.dataset}, {config.max_new_tokens} new tokens max, node budget {config.budget}. "
            "τ = Σ committed / Σ verification forwards (prefill not counted: it commits no token). "
            "tokens/s pooled over requests, prefill included; 90% interval = the speedup's paired "
            "bootstrap interval over the run's requests (which requests were served, not the host's "
            "drift between runs); decode speedup leaves the prefill out "
            "(our loop only). drafter % = the drafter's propose and observe (drafting, and harvesting "
            "into its pools and stores); bookkeeping % = the verifier's mask, greedy walk and KV "
            "compaction, plus the loop's accounting; both are shares of the decode cycle (propose + "
            "forward + observe + bookkeeping). prefill % = share of wall time in prefills; prompt "
            "cached % = prompt tokens whose KV the method's prefix cache held (--prefix-cache). "
            f"{REFERENCE} = transformers generate(do_sample=False), "
            f"the audit reference; FAILED = outputs that differ from it. '{FLY}' rows verify with FLy's "
            "loose rule: LOSSY by design, left out of the audit, with the number of requests whose "
            "output differs from greedy decoding; hf-pld forwards = all model calls of "
            "generate(prompt_lookup_num_tokens=10)." + _sampling_note(config))


def _sampling_note(config) -> str:
    """For a sampled run: what its 'lossless' column holds instead of the audit."""
    sampling = getattr(config, "sampling", None)
    if sampling is None or sampling.greedy:
        return ""
    return (f" SAMPLED at temperature {sampling.temperature}, top-k {sampling.top_k}, top-p "
            f"{sampling.top_p}, seed {sampling.seed}: outputs "
            "differ between methods by design, so the 'lossless' column holds the distribution check "
            "instead of the audit: z of Σ (p(token) − Σp²) over every sampled position, which is "
            "N(0, 1) when each token is drawn from the target's distribution; |z| > 4 FAILS.")


def format_table(rows: list[dict], config) -> str:
    """A Markdown table of a run's summary rows (see the module docstring)."""
    lines = (_main_table(rows) + _ratio_lines(rows) + ar_identity_lines(rows) + _accuracy_lines(rows)
             + _source_lines(rows) + _semantic_lines(rows))
    failures = audit_failure_lines(rows)
    lines += ["", footnote(config)] + ([""] + failures if failures else [])
    return "\n".join(lines)


RECORD_FIELDS = ("method", "request_id", "new_tokens", "forwards", "wall_s")
"""Fields every record of `oilbird bench` has, and that the tables need."""


def read_records(run_dir: Path) -> list[dict]:
    """The records of an `oilbird bench --out run_dir` run, in serving order.

    Raises:
        DatasetError: the directory holds no records, an empty file, or a line that is not a
            record (naming the file and line).
    """
    path = run_dir / "records.jsonl"
    if not path.exists():
        raise DatasetError(f"no benchmark records at {path}; run `oilbird bench --out {run_dir}` first")
    records = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise DatasetError(f"{path}:{number} is not JSON ({err.msg}); the file is damaged: "
                               "re-run the benchmark, or delete that line") from None
        missing = [f for f in RECORD_FIELDS if not isinstance(record, dict) or f not in record]
        if missing:
            raise DatasetError(f"{path}:{number} is not a benchmark record (missing {', '.join(missing)})")
        records.append(record)
    if not records:
        raise DatasetError(f"{path} is empty: the run was stopped before its first request")
    return records


def saved_config(run_dir: Path):
    """The BenchConfig of a run: from summary.json, else config.json (a run in progress), else defaults."""
    from oilbird.bench import BenchConfig  # the harness imports this module

    summary_path, config_path = run_dir / "summary.json", run_dir / "config.json"
    saved = (json.loads(summary_path.read_text())["config"] if summary_path.exists()
             else json.loads(config_path.read_text()) if config_path.exists() else {})
    if "node_budget" in saved:  # summaries written before --budget replaced --node-budget
        saved["budget"] = str(saved.pop("node_budget"))
    from oilbird.sampling import SamplingConfig

    known = {f.name for f in fields(BenchConfig)}
    values = {k: v for k, v in saved.items() if k in known}
    if isinstance(values.get("sampling"), dict):
        values["sampling"] = SamplingConfig(**values["sampling"])
    return BenchConfig(**values)


def _category_table(records: list[dict], methods: list[str], groups: list[str], method: str) -> str:
    lines = [f"| category | requests | τ ({method}) | speedup vs ar | decode speedup | lossless ar / {method} |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for group in groups:
        rows = {r["method"]: r for r in summarize([r for r in records if (r["category"] or "") == group], methods)}
        if method not in rows or "ar" not in rows:
            raise DatasetError(f"the run has no {method!r} or 'ar' records")
        m, ar = rows[method], rows["ar"]
        lines.append(f"| {group} | {m['requests']} | {m['tau']:.2f} | {_times(m['speedup'])} | "
                     f"{_times(m['decode_speedup'])} | {audit_cell(ar)} / {audit_cell(m)} |")
    return "\n".join(lines)


def report(run_dir: Path, by_category: bool = False, first: int | None = None,
           method: str | None = None, under_test: str | None = None) -> str:
    """Markdown tables re-made from a run's records.jsonl (all requests, or one per category).

    Args:
        run_dir: the --out directory of an `oilbird bench` run.
        by_category: one table per request category.
        first: keep only the first N requests served (the records are in serving order).
        method: with `by_category`, one compact table: a row per category for that method.
        under_test: the method whose tokens/s the table sets against every other's, with paired
            intervals (its row goes last, as the last of `--methods` does in the run's own table).

    Raises:
        DatasetError: if the run directory holds no records, or lacks `method` or `under_test`.
    """
    records = read_records(run_dir)
    if first is not None:
        keep = set(list(dict.fromkeys(r["request_id"] for r in records))[:first])
        records = [r for r in records if r["request_id"] in keep]
    config = saved_config(run_dir)
    methods = list(dict.fromkeys(r["method"] for r in records))
    if under_test is not None:
        if under_test not in methods:
            raise DatasetError(f"{run_dir} has no records of {under_test!r}; its methods: {', '.join(methods)}")
        methods = [m for m in methods if m != under_test] + [under_test]
    groups = sorted({r["category"] or "" for r in records}) if by_category else [None]
    if by_category and method:
        return _category_table(records, methods, groups, method)
    parts = []
    for group in groups:
        recs = [r for r in records if group is None or (r["category"] or "") == group]
        if group is not None:
            parts.append(f"### {group} ({len({r['request_id'] for r in recs})} requests)\n")
        parts.append(format_table(summarize(recs, methods), config))
    return "\n\n".join(parts)
