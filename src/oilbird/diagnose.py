"""`oilbird diagnose`: the identifiability-gap diagnosis of a benchmark on a real model.

Replays a dataset request by request: each request's greedy output (transformers `generate`,
do_sample=False) and the hidden states at every position of prompt + output (last layer, and the
input embeddings for the static control) come from the model once and are cached on disk, so a
second run decodes nothing. At every generated position the pool is all earlier requests (their
prompts and outputs), plus, with `within_request`, what the request itself has committed; the pure tests of `oilbird.diagnosis` classify the position. Output: one
JSON record per request (`positions.jsonl`), `summary.json` with the pooled rates per category
and overall, a Markdown table, and optionally a PNG of the per-category breakdown.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from oilbird.audit import greedy_reference
from oilbird.bench import encode_request, read_records, summarize
from oilbird.datasets import Request, Workload
from oilbird.diagnosis import DiagnosisConfig, Position, lexical_positions, neighbour_hits, neighbour_runs
from oilbird.errors import DatasetError
from oilbird.models import LoadedModel, default_cache_dir
from oilbird.suffix_automaton import SuffixAutomaton


@dataclass
class ReplayConfig(Workload):
    """Which requests to replay (the same options, and so the same requests, as `oilbird bench`)."""

    dataset: str = "api-bank"
    """Dataset name (api-bank[/<file>], spec-bench[:categories], humaneval) or a .jsonl path."""
    limit: int = 100000
    """Replay the first N requests (after category selection)."""


def _cache_path(loaded: LoadedModel, ids: list[int], max_new: int) -> Path:
    digest = hashlib.sha256(json.dumps([Path(loaded.source).name, ids, max_new]).encode()).hexdigest()[:24]
    return default_cache_dir() / "diagnose" / f"{digest}.pt"


@torch.inference_mode()
def replay(loaded: LoadedModel, ids: list[int], max_new: int) -> dict:
    """Greedy output, and per position of prompt + output the last-layer and input-embedding
    states (row p predicts token p + 1), cached on disk. Returns {output, hidden, static}."""
    path = _cache_path(loaded, ids, max_new)
    if path.exists():
        return torch.load(path)
    output = greedy_reference(loaded.model, ids, max_new, loaded.stop_ids).output_ids
    full = torch.tensor([ids + output], device=next(loaded.model.parameters()).device)  # [1, T]
    out = loaded.model(input_ids=full, output_hidden_states=True, logits_to_keep=1)
    data = dict(output=output, hidden=out.hidden_states[-1][0].half().cpu(),  # [T, d]
                static=out.hidden_states[0][0].half().cpu())  # [T, d]
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(data, path)
    return data


def _neighbour_tests(data: dict, ids: list[int], output: list[int], pool: tuple,
                     config: DiagnosisConfig) -> tuple[list[int], list[bool]]:
    """Per generated position: the best hidden-state neighbour's run, and the static key's hit.

    `pool` holds per earlier request (keys, static keys, tokens, segment ends) chunks; with
    `config.within_request` the request's own records are appended last, and the query that
    predicts token p + 1 sees only its records 0..p-1 (tokens 1..p): what is committed.
    """
    keys, statics, tokens, ends = (list(chunks) for chunks in pool)
    rows = slice(len(ids) - 1, len(ids) - 1 + len(output))  # states predicting each output token
    visible = None
    if config.within_request:
        pooled = sum(len(chunk) for chunk in tokens)
        full = ids + output
        keys.append(data["hidden"][:-1])
        statics.append(data["static"][:-1])
        tokens.append(full[1:])
        ends.append([pooled + len(full) - 1] * (len(full) - 1))
        visible = [pooled + p for p in range(rows.start, rows.stop)]
    width = data["hidden"].shape[1]
    pool_keys = torch.cat(keys) if keys else torch.zeros(0, width)  # [m, d]
    pool_static = torch.cat(statics) if statics else torch.zeros(0, data["static"].shape[1])  # [m, d]
    pool_tokens = torch.tensor([t for chunk in tokens for t in chunk], dtype=torch.long)  # [m]
    pool_ends = torch.tensor([e for chunk in ends for e in chunk], dtype=torch.long)  # [m]
    runs = neighbour_runs(data["hidden"][rows], pool_keys, pool_tokens, pool_ends,
                          [output[t:] for t in range(len(output))], config.candidates, visible)
    static = neighbour_hits(data["static"][rows], pool_static, pool_tokens, output, config.candidates, visible)
    return runs, static


def run_diagnosis(loaded: LoadedModel, replay_config: ReplayConfig,
                  config: DiagnosisConfig | None = None, out_dir: Path | None = None,
                  progress: bool = True, requests: list[Request] | None = None) -> dict:
    """Diagnose a dataset: per-position presence, oracle, gap, run and semantic reach.

    Args:
        loaded: the model whose greedy outputs and hidden states are diagnosed.
        replay_config: which requests (loaded here unless `requests` is given).
        config: the diagnosis's parameters (the paper's values by default).
        out_dir: where to write positions.jsonl and summary.json (None: nothing written).
        progress: show a progress bar.
        requests: the already loaded `replay_config.requests()`.

    Returns:
        The summary: pooled rates overall and per category, with the table as Markdown.

    Raises:
        DatasetError: for an unknown dataset or a malformed record.
    """
    config = config or DiagnosisConfig()
    requests = replay_config.requests() if requests is None else requests
    sam = SuffixAutomaton()
    keys, statics, tokens, ends = [], [], [], []  # pool records: state predicting token, per request
    records = []
    for request in tqdm(requests, desc=f"diagnose {replay_config.dataset}", unit="req", disable=not progress):
        ids = encode_request(loaded, request)
        data = replay(loaded, ids, replay_config.max_new_tokens)
        output = data["output"]
        positions = lexical_positions(sam, ids, output, config)
        if output:
            runs, static = _neighbour_tests(data, ids, output, (keys, statics, tokens, ends), config)
            for position, run, st in zip(positions, runs, static):
                position.semantic_hit, position.static_hit, position.neighbour_run = run > 0, st, run
        records.append(dict(request_id=request.id, category=request.category,
                            positions=[asdict(p) for p in positions]))
        text = ids + output  # the request joins the pool only now: strictly earlier requests
        sam.extend_many(text)
        sam.end_document()
        keys.append(data["hidden"][:-1])
        statics.append(data["static"][:-1])
        start = sum(len(chunk) for chunk in tokens)
        tokens.append(text[1:])
        ends.append([start + len(text) - 1] * (len(text) - 1))
    summary = summarise(records)
    summary.update(model=loaded.name, config=asdict(config), replay=asdict(replay_config),
                   request_ids=[r["request_id"] for r in records])
    summary["table"] = format_diagnosis(summary)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        with open(out_dir / "positions.jsonl", "w") as f:
            for record in records:
                f.write(json.dumps(record) + "\n")
        (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def rates(positions: list[Position]) -> dict:
    """Pooled rates over positions (fractions of all positions, reach as fractions of gaps)."""
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
        neighbour_run_at_gap=(sum(p.neighbour_run or 0 for p in gaps) / len(gaps)) if gaps else 0.0,
        semantic_reach=frac([p for p in gaps if p.semantic_hit], len(gaps)),
        semantic_reach_control=frac([p for p in gaps4 if p.semantic_hit], len(gaps4)),
        static_reach=frac([p for p in gaps if p.static_hit], len(gaps)),
        # Of the present positions: which key reaches them.
        exact_only=frac([p for p in exact if not p.semantic_hit], len(present)),
        semantic_only=frac([p for p in semantic if not p.oracle_hit], len(present)),
        both=frac([p for p in exact if p.semantic_hit], len(present)),
    )


def summarise(records: list[dict]) -> dict:
    """Rates overall and per category from per-request position records."""
    def positions(recs):
        return [Position(**p) for r in recs for p in r["positions"]]

    categories = list(dict.fromkeys(r["category"] for r in records))
    return dict(overall=rates(positions(records)), requests=len(records),
                categories={str(c): rates(positions([r for r in records if r["category"] == c]))
                            for c in categories})


def format_diagnosis(summary: dict) -> str:
    """A Markdown table: one row per category and one overall."""
    head = ("| category | positions | presence (2) | presence (4) | oracle miss | gap | gap (4) | "
            "run behind gap | neighbour matches | semantic reach | semantic reach (4) | static reach | exact only | semantic only | both |")
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
                     f"{mean('run_behind_gap')} | {mean('neighbour_run_at_gap')} | "
                     f"{pct('semantic_reach', 'gap_positions')} | {pct('semantic_reach_control', 'gap_control_positions')} | "
                     f"{pct('static_reach', 'gap_positions')} | {pct('exact_only', 'present_positions')} | "
                     f"{pct('semantic_only', 'present_positions')} | {pct('both', 'present_positions')} |")
    pool = ("earlier requests or earlier in the same request" if summary.get("config", {}).get("within_request")
            else "earlier requests")
    lines.append("")
    lines.append("Rates are shares of generated positions; reach columns are shares of gap positions "
                 f"(gap = the next 2 (4) tokens occur verbatim in {pool} but the exact-match "
                 "oracle's 8 candidates miss); run behind gap = tokens from there that occur verbatim in a row; "
                 "neighbour matches = how many of them the best of the top-8 hidden-state neighbours offers; exact only / semantic only / both are shares of present "
                 "positions; – where there is nothing to take a share of. Paper, API-Bank: presence 92%, oracle miss 13%, gap 6.8%, semantic reach "
                 "81%, static embedding 23%.")
    return "\n".join(lines)


def plot_diagnosis(summary: dict, path: Path) -> None:
    """Grouped bars per category: presence, oracle miss, gap, semantic and static reach (PNG)."""
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
    """Spearman's rank correlation (ties share their mean rank); None below 3 points or for a constant."""
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
    """A Markdown table of `gap_vs_share`, with the rank correlation under it."""
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
