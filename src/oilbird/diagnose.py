"""`oilbird diagnose`: the identifiability-gap diagnosis of a benchmark on a real model.

Replays a dataset request by request: each request's greedy output (transformers `generate`,
do_sample=False) and the hidden states at every position of prompt + output (last layer, and the
input embeddings for the static control) come from the model once and are cached on disk, so a
second run decodes nothing. At every generated position the pool is all earlier requests (their
prompts and outputs); the pure tests of `oilbird.diagnosis` classify the position. Output: one
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
from oilbird.bench import encode_request
from oilbird.datasets import load_dataset
from oilbird.diagnosis import DiagnosisConfig, Position, lexical_positions, neighbour_hits, neighbour_runs
from oilbird.models import LoadedModel, default_cache_dir
from oilbird.suffix_automaton import SuffixAutomaton


@dataclass
class ReplayConfig:
    """Which requests to replay."""

    dataset: str = "api-bank"
    """Dataset name (as for `oilbird bench`) or a .jsonl path."""
    limit: int = 100000
    """Replay the first N requests (after category selection)."""
    per_category: int = 0
    """If > 0, at most N requests of each category (file)."""
    skip: int = 0
    """Skip the first N requests of each category."""
    max_new_tokens: int = 64
    """Greedy tokens generated per request."""
    data_dir: str = ""
    """Folder holding the shared datasets; empty: find ../shared/datasets."""


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


def run_diagnosis(loaded: LoadedModel, replay_config: ReplayConfig,
                  config: DiagnosisConfig | None = None, out_dir: Path | None = None,
                  progress: bool = True) -> dict:
    """Diagnose a dataset: per-position presence, oracle, gap, run and semantic reach.

    Returns:
        The summary: pooled rates overall and per category, with the table as Markdown.
    """
    config = config or DiagnosisConfig()
    requests = load_dataset(replay_config.dataset, limit=replay_config.limit,
                            per_category=replay_config.per_category or None, skip=replay_config.skip,
                            data_dir=Path(replay_config.data_dir) if replay_config.data_dir else None)
    sam = SuffixAutomaton()
    keys, statics, tokens, ends = [], [], [], []  # pool records: state predicting token, per request
    records = []
    for request in tqdm(requests, desc=f"diagnose {replay_config.dataset}", unit="req", disable=not progress):
        ids = encode_request(loaded, request)
        data = replay(loaded, ids, replay_config.max_new_tokens)
        output = data["output"]
        positions = lexical_positions(sam, ids, output, config)
        if output:
            rows = slice(len(ids) - 1, len(ids) - 1 + len(output))  # states predicting each output token
            pool_keys = torch.cat(keys) if keys else torch.zeros(0, data["hidden"].shape[1])
            pool_static = torch.cat(statics) if statics else torch.zeros(0, data["static"].shape[1])
            pool_tokens = torch.tensor([t for chunk in tokens for t in chunk], dtype=torch.long)
            pool_ends = torch.tensor([e for chunk in ends for e in chunk], dtype=torch.long)
            sem = neighbour_runs(data["hidden"][rows], pool_keys, pool_tokens, pool_ends,
                                 [output[t:] for t in range(len(output))], config.candidates)
            static = neighbour_hits(data["static"][rows], pool_static, pool_tokens, output, config.candidates)
            for position, run, st in zip(positions, sem, static):
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
    summary.update(model=loaded.name, config=asdict(config), replay=asdict(replay_config))
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
        positions=n, presence=frac(present, n),
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
        pct = lambda x: f"{100 * x:.1f}%"  # noqa: E731
        lines.append(f"| {name} | {r['positions']} | {pct(r['presence'])} | {pct(r['presence_control'])} | "
                     f"{pct(r['oracle_miss'])} | {pct(r['gap'])} | {pct(r['gap_control'])} | "
                     f"{r['run_behind_gap']:.1f} | {r['neighbour_run_at_gap']:.1f} | {pct(r['semantic_reach'])} | {pct(r['semantic_reach_control'])} | "
                     f"{pct(r['static_reach'])} | {pct(r['exact_only'])} | {pct(r['semantic_only'])} | {pct(r['both'])} |")
    lines.append("")
    lines.append("Rates are shares of generated positions; reach columns are shares of gap positions "
                 "(gap = the next 2 (4) tokens occur verbatim in earlier requests but the exact-match "
                 "oracle's 8 candidates miss); run behind gap = tokens from there that occur verbatim in a row; "
                 "neighbour matches = how many of them the best of the top-8 hidden-state neighbours offers; exact only / semantic only / both are shares of present "
                 "positions. Paper, API-Bank: presence 92%, oracle miss 13%, gap 6.8%, semantic reach "
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
