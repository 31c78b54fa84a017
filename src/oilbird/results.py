"""Cross-run results: the Table-1 style comparison and its plot, made from `oilbird bench` runs.

Contract:
- Input: run directories written by `oilbird bench --out DIR` (records.jsonl, and summary.json
  when the run finished). Rows are re-computed from the records, so a cut run still reports;
  pool memory is known only from a finished run's summary.
- `comparison_table` groups runs by model: one Markdown table per model, a row per method
  (as labeled in the runs, e.g. 'goose@60', 'goose@auto'), and per dataset τ and the speedup
  against the `ar` of that same run, with its 90% paired interval over the run's requests in
  square brackets (oilbird/intervals.py) and, in parentheses, the decode phase's alone (prefill
  left out).
  Speedups are never compared across runs. A strict method with a divergent output reads
  `FAILED n/m`, with an `AUDIT FAILED` line under the table.
- `plot_comparison` draws the same numbers as grouped bars (τ and speedup, per model), PNG.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from oilbird.summary import REFERENCE, summarize
from oilbird.tables import audit_failure_lines, interval_cell, read_records
from oilbird.errors import DatasetError


@dataclass
class Run:
    """One benchmark run, summarized."""

    model: str
    dataset: str
    requests: int
    rows: dict[str, dict]  # method label -> summary row (see bench.summarize)
    environment: dict


def load_run(run_dir: Path) -> Run:
    """Summarize one `oilbird bench` output directory.

    Raises:
        DatasetError: the directory holds no records.
    """
    records = read_records(run_dir)
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    # A request counts only when every method finished it (runs written before records were
    # emitted per whole request may end mid-request).
    methods = list(dict.fromkeys(r["method"] for r in records))
    seen: dict[str, set] = {}
    for r in records:
        seen.setdefault(r["request_id"], set()).add(r["method"])
    done = {rid for rid, have in seen.items() if len(have) == len(methods)}
    records = [r for r in records if r["request_id"] in done]
    rows = {row["method"]: row for row in summarize(records, methods)}
    for saved in summary.get("rows", []):  # memory is measured at the end of a finished run
        if saved["method"] in rows:
            rows[saved["method"]]["memory_bytes"] = saved.get("memory_bytes")
    config = summary.get("config", {})
    return Run(model=summary.get("model", {}).get("name", "?"),
               dataset=config.get("dataset", run_dir.name), requests=len(done), rows=rows,
               environment=summary.get("environment", {}))


def merge_runs(runs: list[Run]) -> list[Run]:
    """Runs of one model on one dataset become one column: later runs add the methods they have
    and replace the rows they repeat (a re-run supersedes), except the baselines `ar` and the
    reference, which stay the first run's. Each row keeps the speedup against its own run's `ar`.

    Raises:
        DatasetError: two such runs served a different number of requests.
    """
    merged: dict[tuple[str, str], Run] = {}
    for run in runs:
        key = (run.model, run.dataset)
        if key not in merged:
            merged[key] = Run(run.model, run.dataset, run.requests, dict(run.rows), run.environment)
            continue
        first = merged[key]
        if first.requests != run.requests:
            raise DatasetError(f"two {run.model} runs on {run.dataset} served {first.requests} and "
                               f"{run.requests} requests: only runs over the same requests share a column")
        for method, row in run.rows.items():
            if method not in ("ar", REFERENCE) or method not in first.rows:
                first.rows[method] = row
    return list(merged.values())


def _method_order(runs: list[Run]) -> list[str]:
    labels = list(dict.fromkeys(m for run in runs for m in run.rows if m != REFERENCE))
    return ["ar"] + [m for m in labels if m != "ar"]


def _speedup_cell(row: dict) -> str:
    """'1.90x [1.64–2.22]': the speedup vs the run's `ar` and its paired interval, when it has one."""
    if row["speedup"] is None:
        return "–"
    interval = row.get("speedup_interval")
    return f"{row['speedup']:.2f}x" + (f" [{interval_cell(interval)}]" if interval else "")


def comparison_table(runs: list[Run]) -> str:
    """Markdown: per model, a row per method with τ and same-run speedup per dataset."""
    parts = []
    for model in dict.fromkeys(run.model for run in runs):
        mine = [run for run in runs if run.model == model]
        head = "| method | " + " | ".join(f"{r.dataset} ({r.requests}) τ | speedup [90%] (decode)" for r in mine)
        head += " | lossless | drafter + bookkeeping % (max) | pool memory MiB (max) |"
        lines = [f"**{model}**", "", head,
                 "| --- |" + " ---: | ---: |" * len(mine) + " ---: | ---: | ---: |"]
        for method in _method_order(mine):
            cells, audited, lossless, overhead, memory, lossy = [], 0, 0, [], [], False
            for run in mine:
                row = run.rows.get(method)
                if row is None:
                    cells += ["–", "–"]
                    continue
                speed = _speedup_cell(row)
                if row.get("decode_speedup") is not None:
                    speed += f" ({row['decode_speedup']:.2f}x)"
                cells += [f"{row['tau']:.2f}", speed]
                audited += row["audited"]
                lossless += row["lossless"]
                lossy = lossy or bool(row.get("lossy"))
                if row.get("overhead_share") is not None:
                    overhead.append(row["overhead_share"])
                if row.get("memory_bytes"):
                    memory.append(row["memory_bytes"])
            audit = ("LOSSY (FLy)" if lossy else "not audited" if not audited
                     else f"{lossless}/{audited}" if lossless == audited else f"FAILED {lossless}/{audited}")
            over = f"{100 * max(overhead):.1f}%" if overhead else "–"
            mem = f"{max(memory) / 2**20:.1f}" if memory else "–"
            lines.append(f"| {method} | " + " | ".join(cells) + f" | {audit} | {over} | {mem} |")
        failures = [f"{run.dataset}: {line}" for run in mine for line in audit_failure_lines(list(run.rows.values()))]
        parts.append("\n".join(lines + ([""] + failures if failures else [])))
    return "\n\n".join(parts)


def source_shares(runs: list[Run]) -> str:
    """Markdown list: for multi-source methods, each source's share of accepted drafts."""
    lines = []
    for run in runs:
        for method, row in run.rows.items():
            if len(row.get("source_share") or {}) > 1:
                shares = ", ".join(f"{s} {100 * v:.0f}% (sole {100 * row['sole_source_share'].get(s, 0):.0f}%)"
                                   for s, v in sorted(row["source_share"].items()))
                lines.append(f"- {run.model}, {run.dataset}, {method}: {shares}")
    return "\n".join(lines)


def plot_comparison(runs: list[Run], path: Path) -> None:
    """Grouped bars of τ and speedup per method and dataset, one row of panels per model."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(run.model for run in runs))
    fig, axes = plt.subplots(len(models), 2, figsize=(16, 4.2 * len(models)), squeeze=False)
    for i, model in enumerate(models):
        mine = [run for run in runs if run.model == model]
        methods = _method_order(mine)
        width = 0.8 / len(mine)
        for j, (metric, title) in enumerate((("tau", "accepted length τ"),
                                             ("speedup", "speedup vs ar (same run)"))):
            ax = axes[i][j]
            for k, run in enumerate(mine):
                values = [(run.rows.get(m) or {}).get(metric) or 0.0 for m in methods]
                ax.bar([x + k * width for x in range(len(methods))], values, width, label=run.dataset)
            if metric == "speedup":
                ax.axhline(1.0, color="black", linewidth=0.8)
            ax.set_xticks([x + width * (len(mine) - 1) / 2 for x in range(len(methods))])
            ax.set_xticklabels(methods, rotation=45, ha="right", fontsize=8)
            ax.set_title(f"{model}: {title}")
            ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# Pairs that isolate the semantic source: (without it, with it) at the same budget and pool.
SEMANTIC_PAIRS = [("oilbird[sem_entry_budget=0]", "oilbird", "controlled pair (entry budget 0 vs default)"),
                  ("goose", "oilbird", "GOOSE vs Oilbird"),
                  ("goose@auto", "oilbird@auto", "GOOSE vs Oilbird, hardware-aware budget"),
                  ("pld", "oilbird-pld", "transplant into prompt lookup"),
                  ("tr", "oilbird-tr", "transplant into Token Recycling"),
                  ("suffix", "oilbird-suffix", "transplant into SuffixDecoding")]


def _gain(base: dict, new: dict) -> str:
    return f"{100 * (new['tau'] / base['tau'] - 1):+.1f}%" if base["tau"] else "–"


def semantic_report(runs: list[Run]) -> str:
    """Markdown: what the semantic source is worth, from runs that hold the pairs and ablations.

    Three tables: the τ gain of each pair in `SEMANTIC_PAIRS` per run (with both speedups); the
    ablations (rows 'oilbird[...]' against 'oilbird'); per method with the source, its sole-source
    share, retrieval / merge / harvest milliseconds per drafting cycle and the store's bytes per
    record.
    """
    lines = ["| model | dataset (requests) | pair | τ without → with | gain | speedup without → with |",
             "| --- | --- | --- | ---: | ---: | ---: |"]
    for run in runs:
        for base, new, what in SEMANTIC_PAIRS:
            b, n = run.rows.get(base), run.rows.get(new)
            if b and n:
                speed = (f"{b['speedup']:.2f}x → {n['speedup']:.2f}x"
                         if b["speedup"] is not None and n["speedup"] is not None else "–")
                lines.append(f"| {run.model} | {run.dataset} ({run.requests}) | {what}: {base} → {new} | "
                             f"{b['tau']:.2f} → {n['tau']:.2f} | {_gain(b, n)} | {speed} |")
    ablations = ["", "| model | dataset | ablation | τ | vs oilbird | speedup | lossless |",
                 "| --- | --- | --- | ---: | ---: | ---: | ---: |"]
    for run in runs:
        full = run.rows.get("oilbird")
        for method, row in run.rows.items():
            if full and method.startswith("oilbird[") and method != "oilbird[sem_entry_budget=0]":
                speed = _speedup_cell(row)
                ablations.append(f"| {run.model} | {run.dataset} | {method} | {row['tau']:.2f} | "
                                 f"{_gain(full, row)} | {speed} | {row['lossless']}/{row['audited']} |")
    costs = ["", "| model | dataset | method | semantic sole share | fired | paid nodes accepted | "
             "retrieval ms/cycle | merge ms/cycle | harvest ms/cycle | share of cycle | store records | bytes/record |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for run in runs:
        for method, row in run.rows.items():
            s = row.get("semantic")
            if not s or not s["cycles"]:
                continue
            sole = row.get("sole_source_share", {}).get("sem", 0.0)
            costs.append(
                f"| {run.model} | {run.dataset} | {method} | {100 * sole:.1f}% | {100 * s['fired_share']:.0f}% | "
                f"{100 * s['paid_accepted'] / max(1, s['paid_nodes']):.1f}% | {s['retrieve_ms_per_cycle']:.2f} | "
                f"{s['merge_ms_per_cycle']:.2f} | {s['harvest_ms_per_cycle']:.2f} | {100 * s['share_of_cycle']:.1f}% | "
                f"{s['store_records']} | {s['bytes_per_record']} |")
    out = "\n".join(lines)
    if len(ablations) > 3:
        out += "\n" + "\n".join(ablations)
    if len(costs) > 3:
        out += "\n" + "\n".join(costs)
    return out
