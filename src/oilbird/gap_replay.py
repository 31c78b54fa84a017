"""`oilbird diagnose`: replaying a benchmark on a real model to measure the identifiability gap.

Contract:
- `replay(loaded, ids, max_new)`: a request's greedy output (transformers `generate`,
  do_sample=False) and the hidden states at every position of prompt + output (last layer, and
  the input embeddings for the static control). They come from the model once and are cached
  under `<cache_dir>/diagnose/`, keyed by the model file's name, the prompt and `max_new`, so a second
  run decodes nothing.
- `run_diagnosis(loaded, replay_config, config, ...)`: replays a dataset request by request. At
  every generated position the pool is all earlier requests (their prompts and outputs), plus,
  with `within_request`, what the request itself has committed; the pure measures of
  `gap_measures.py` classify the position. Writes one JSON record per request
  (`positions.jsonl`) and `summary.json`; returns the summary of `gap_report.py` (pooled rates
  per category and overall, with the Markdown table).
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
from oilbird.datasets import Request, Workload
from oilbird.gap_measures import DiagnosisConfig, lexical_positions, neighbor_hits, neighbor_runs
from oilbird.gap_report import format_diagnosis, summarize_diagnosis
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
    """Greedy output, and the states at every position of prompt + output, cached on disk.

    Args:
        loaded: the model.
        ids: the prompt's token ids.
        max_new: the most tokens to generate.
    Returns:
        {output: generated ids, hidden: [T, d] last-layer states, static: [T, d] input
        embeddings}, both float16 on the CPU; row p predicts token p + 1 of prompt + output.
    """
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


def _neighbor_tests(data: dict, ids: list[int], output: list[int], pool: tuple,
                     config: DiagnosisConfig) -> tuple[list[int], list[bool]]:
    """Per generated position: the best hidden-state neighbor's run, and the static key's hit.

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
    runs = neighbor_runs(data["hidden"][rows], pool_keys, pool_tokens, pool_ends,
                          [output[t:] for t in range(len(output))], config.candidates, visible)
    static = neighbor_hits(data["static"][rows], pool_static, pool_tokens, output, config.candidates, visible)
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
            runs, static = _neighbor_tests(data, ids, output, (keys, statics, tokens, ends), config)
            for position, run, st in zip(positions, runs, static):
                position.semantic_hit, position.static_hit, position.neighbor_run = run > 0, st, run
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
    summary = summarize_diagnosis(records)
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
