"""The identifiability-gap diagnosis's results: pooled rates, the table, the plot, the comparison.

Contract:
- `rates(positions)`: pooled rates over diagnosed positions (`gap_measures.Position`): shares of
  all positions, reach as shares of gap positions, exact-only / semantic-only / both as shares
  of present positions. `summarize_diagnosis(records)` gives them overall and per category from
  the per-request records of `gap_replay.run_diagnosis`.
- `format_diagnosis(summary)` is the Markdown table `oilbird diagnose` prints (a dash where a
  share has nothing to be taken of); `plot_diagnosis(summary, path)` draws it as grouped bars.
- `gap_vs_share(summary, run_dir)` sets each category's gap beside the semantic source's
  sole-source share measured by an `oilbird bench` run over the very same requests (checked by
  `bench_records`), with Spearman's rank correlation (`spearman`) over the categories;
  `format_gap_vs_share` prints it.
Pure functions of their inputs, apart from reading the bench run and writing the plot.
"""

from __future__ import annotations

from pathlib import Path

from oilbird.errors import DatasetError
from oilbird.gap_measures import Position
from oilbird.summary import summarize
from oilbird.tables import read_records


def rates(positions: list[Position]) -> dict:
    """Pooled rates over positions (fractions of all positions, reach as fractions of gaps).

    Args:
        positions: diagnosed positions, from any number of requests.
    Returns:
        counts (positions, gap_positions, gap_control_positions, present_positions) and rates
        (presence, oracle_miss, gap, reach, exact_only / semantic_only / both, ...); a share of
        nothing is 0.0 (the table prints a dash there).
    """
    n = len(positions)
    gaps = [p for p in positions if p.gap]
    gaps4 = [p for p in positions if p.gap_control]
    present = [p for p in positions if p.present]

    def frac(items, total):
        return len(items) / total if total else 0.0

    exact = [p for p in present if p.oracle_hit]
    semantic = [p for p in present if p.semantic_hit]
    return dict(
        positions=n, gap_positions=len(gaps), gap_control_positions=len(gaps4), present_positions=len(present),
        presence=frac(present, n),
        presence_control=frac([p for p in positions if p.present_control], n),
        oracle_miss=frac([p for p in positions if not p.oracle_hit], n),
        gap=frac(gaps, n), gap_control=frac(gaps4, n),
        run_behind_gap=sum(p.run for p in gaps) / len(gaps) if gaps else 0.0,
        neighbor_run_at_gap=(sum(p.neighbor_run or 0 for p in gaps) / len(gaps)) if gaps else 0.0,
        semantic_reach=frac([p for p in gaps if p.semantic_hit], len(gaps)),
        semantic_reach_control=frac([p for p in gaps4 if p.semantic_hit], len(gaps4)),
        static_reach=frac([p for p in gaps if p.static_hit], len(gaps)),
        # Of the present positions: which key reaches them.
        exact_only=frac([p for p in exact if not p.semantic_hit], len(present)),
        semantic_only=frac([p for p in semantic if not p.oracle_hit], len(present)),
        both=frac([p for p in exact if p.semantic_hit], len(present)),
    )


def summarize_diagnosis(records: list[dict]) -> dict:
    """Rates overall and per category from per-request position records.

    Args:
        records: `{request_id, category, positions: [Position as a dict]}` per request.
    Returns:
        {overall: rates, requests: count, categories: {category: rates}} in first-seen order.
    """
    def positions(recs):
        return [Position(**p) for r in recs for p in r["positions"]]

    categories = list(dict.fromkeys(r["category"] for r in records))
    return dict(overall=rates(positions(records)), requests=len(records),
                categories={str(c): rates(positions([r for r in records if r["category"] == c]))
                            for c in categories})


def format_diagnosis(summary: dict) -> str:
    """A Markdown table: one row per category and one overall, with a footnote defining the columns.

    Args:
        summary: a `summarize_diagnosis` result (with `config` for the footnote's pool wording).
    Returns:
        the table as Markdown.
    """
    head = ("| category | positions | presence (2) | presence (4) | oracle miss | gap | gap (4) | "
            "run behind gap | neighbor matches | semantic reach | semantic reach (4) | static reach | exact only | semantic only | both |")
    lines = [head, "| --- |" + " ---: |" * 14]
    rows = list(summary["categories"].items()) + [("all", summary["overall"])]
    for name, r in rows:
        def pct(key: str, over: str | None = None) -> str:
            # A share of nothing (no gap, no present position) is not 0%: print a dash.
            return "–" if over and r.get(over, 1) == 0 else f"{100 * r[key]:.1f}%"

        def mean(key: str) -> str:
            return "–" if r.get("gap_positions", 1) == 0 else f"{r[key]:.1f}"

        lines.append(f"| {name} | {r['positions']} | {pct('presence')} | {pct('presence_control')} | "
                     f"{pct('oracle_miss')} | {pct('gap')} | {pct('gap_control')} | "
                     f"{mean('run_behind_gap')} | {mean('neighbor_run_at_gap')} | "
                     f"{pct('semantic_reach', 'gap_positions')} | {pct('semantic_reach_control', 'gap_control_positions')} | "
                     f"{pct('static_reach', 'gap_positions')} | {pct('exact_only', 'present_positions')} | "
                     f"{pct('semantic_only', 'present_positions')} | {pct('both', 'present_positions')} |")
    pool = ("earlier requests or earlier in the same request" if summary.get("config", {}).get("within_request")
            else "earlier requests")
    lines.append("")
    lines.append("Rates are shares of generated positions; reach columns are shares of gap positions "
                 f"(gap = the next 2 (4) tokens occur verbatim in {pool} but the exact-match "
                 "oracle's 8 candidates miss); run behind gap = tokens from there that occur verbatim in a row; "
                 "neighbor matches = how many of them the best of the top-8 hidden-state neighbors offers; exact only / semantic only / both are shares of present "
                 "positions; – where there is nothing to take a share of. Paper, API-Bank: presence 92%, oracle miss 13%, gap 6.8%, semantic reach "
                 "81%, static embedding 23%.")
    return "\n".join(lines)


def plot_diagnosis(summary: dict, path: Path) -> None:
    """Grouped bars per category: presence, oracle miss, gap, semantic and static reach (PNG).

    Args:
        summary: a `run_diagnosis` summary.
        path: the PNG file to write (its directory is created).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(summary["categories"]) + ["all"]
    rows = list(summary["categories"].values()) + [summary["overall"]]
    metrics = [("presence", "presence (2)"), ("oracle_miss", "oracle miss"), ("gap", "gap"),
               ("semantic_reach", "semantic reach (of gaps)"), ("static_reach", "static reach (of gaps)")]
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(names) + 2), 4))
    width = 0.8 / len(metrics)
    for i, (key, label) in enumerate(metrics):
        ax.bar([x + i * width for x in range(len(names))], [100 * r[key] for r in rows], width, label=label)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(names))], names, rotation=30, ha="right")
    ax.set_ylabel("%")
    ax.set_title(f"Identifiability gap: {summary.get('model', '')}, {summary.get('replay', {}).get('dataset', '')}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's rank correlation (ties share their mean rank).

    Returns:
        the correlation in [-1, 1]; None below 3 points or when either side is constant.
    """
    def ranks(values: list[float]) -> list[float]:
        order = sorted(range(len(values)), key=lambda i: values[i])
        out = [0.0] * len(values)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for k in range(i, j + 1):
                out[order[k]] = (i + j) / 2
            i = j + 1
        return out

    if len(xs) < 3:
        return None
    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx, syy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return sxy / (sxx * syy) ** 0.5 if sxx and syy else None


def bench_records(run_dir: Path, method: str, request_ids: list[str]) -> list[dict]:
    """The records of `method` in a bench run, checked to cover exactly `request_ids`.

    Raises:
        DatasetError: no records, no `method` row, or other requests than `request_ids`.
    """
    records = [r for r in read_records(run_dir) if r["method"] == method]
    if not records:
        raise DatasetError(f"{run_dir} has no {method!r} records; pass the method that ran there (--compare-method)")
    served = [r["request_id"] for r in records]
    if sorted(served) != sorted(request_ids):
        raise DatasetError(
            f"{run_dir} served {len(served)} requests and the diagnosis covers {len(request_ids)}, not the same "
            "ones; diagnose with the bench run's --dataset, --per-category, --skip and --limit")
    return records


def gap_vs_share(summary: dict, run_dir: Path, method: str = "oilbird") -> dict:
    """Each category's gap beside the semantic source's measured sole-source share.

    The share comes from an `oilbird bench` run over the very same requests (same dataset,
    --per-category, --skip, --limit and model): of the draft tokens `method` had accepted, the
    share only the semantic source had proposed, and the same per 100 generated tokens (the unit
    of the gap).

    Args:
        summary: a `run_diagnosis` summary.
        run_dir: the bench run's output directory.
        method: the bench row with the semantic source.

    Returns:
        {rows: [{category, gap, gap_control, semantic_reach, semantic_only, tau, sole_share,
        sole_per_100}], spearman: {gap, gap_control, semantic_only}: each one's rank correlation with the
        sole share over the categories}.

    Raises:
        DatasetError: the run lacks `method`, or served other requests than were diagnosed.
    """
    records = bench_records(run_dir, method, summary.get("request_ids", []))
    rows = []
    for name, rates_ in list(summary["categories"].items()) + [("all", summary["overall"])]:
        recs = records if name == "all" else [r for r in records if str(r["category"]) == name]
        row = summarize(recs, [method])[0]
        sole = (row.get("sole_source_share") or {}).get("sem", 0.0)
        generated = sum(r["new_tokens"] for r in recs)
        rows.append(dict(category=name, gap=rates_["gap"], gap_control=rates_["gap_control"],
                         semantic_reach=rates_["semantic_reach"], semantic_only=rates_["semantic_only"],
                         tau=row["tau"], sole_share=sole,
                         sole_per_100=100 * sole * row["accepted_drafts"] / generated if generated else 0.0))
    per_category = [r for r in rows if r["category"] != "all"]
    shares = [r["sole_share"] for r in per_category]
    return dict(run=str(run_dir), method=method, rows=rows,
                spearman={key: spearman([r[key] for r in per_category], shares)
                          for key in ("gap", "gap_control", "semantic_only")})


def format_gap_vs_share(comparison: dict) -> str:
    """A Markdown table of `gap_vs_share`, with the rank correlation under it.

    Args:
        comparison: a `gap_vs_share` result.
    Returns:
        the table as Markdown.
    """
    lines = [f"| category | gap | gap (4) | semantic reach | semantic only (of present) | {comparison['method']} τ | "
             "sem sole share (of accepted drafts) | sem sole tokens per 100 generated |",
             "| --- |" + " ---: |" * 7]
    for r in comparison["rows"]:
        lines.append(f"| {r['category']} | {100 * r['gap']:.1f}% | {100 * r['gap_control']:.1f}% | "
                     f"{100 * r['semantic_reach']:.1f}% | {100 * r['semantic_only']:.1f}% | {r['tau']:.2f} | "
                     f"{100 * r['sole_share']:.1f}% | {r['sole_per_100']:.1f} |")

    def rho(key: str) -> str:
        value = comparison["spearman"][key]
        return "– (fewer than 3 categories)" if value is None else f"{value:+.2f}"

    lines.append("")
    lines.append(f"Spearman rank correlation with the sole share over the categories: gap {rho('gap')}, "
                 f"gap (4) {rho('gap_control')}, semantic only {rho('semantic_only')}.")
    return "\n".join(lines)
