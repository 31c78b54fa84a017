"""The benchmark harness behind `oilbird bench`.

Contract:
- One dataset, requests served in file order. Every method (autoregressive `ar` always included,
  as the speed baseline) runs on the same requests in the same process; for each request the
  methods run back to back, so slow drift of the machine hits all of them alike.
- Each drafter instance lives for the whole dataset (cross-request drafters accumulate their pool
  in serving order); the warm-up uses throw-away instances so it leaks nothing into the pools.
- Budgets: `budget` may list several ('60,auto'), and a method may name its own ('goose@auto');
  each (method, budget) is its own drafter instance with its own pool and budget policy, reported
  as its own row, against the one shared `ar`.
- τ = Σ committed tokens / Σ verification forwards, pooled over the dataset. The prefill is not a
  verification forward and commits no token (the last prompt token is the first anchor).
- Speed: tokens/s = Σ generated tokens / Σ request wall time (prefill included), pooled; speedup =
  method tokens/s / `ar` tokens/s from this run.
- Audit: every method's token ids against an independent `generate(do_sample=False)` run, with
  the first divergence and the reference's top-1/top-2 logit margin there.
- Output: a Markdown table on stdout; `config.json` (the run's settings, written first);
  `records.jsonl` (one record per request and method,
  written when the request has run under every method) and `summary.json` in the output
  directory. Ctrl-C (or SIGTERM, from `oilbird bench`) stops serving and still summarises the
  requests that finished.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from argparse import ArgumentTypeError
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import torch
from tqdm import tqdm

from oilbird.accuracy import Grader, gradable
from oilbird.audit import compare, differences, greedy_reference, hf_prompt_lookup
from oilbird.budget import AdaptiveBudget, BudgetConfig, load_or_measure
from oilbird.config import field_types, parse_bool
from oilbird.datasets import Workload
from oilbird.decode import DecodeConfig, check_prompt, decode
from oilbird.drafters import DRAFTERS, make_drafter
from oilbird.fly import FlyConfig
from oilbird.errors import ConfigError, DatasetError
from oilbird.models import LoadedModel, default_cache_dir
from oilbird.verifier import TreeVerifier, VerifierConfig

# Methods that are not our drafters but external runs reported beside them.
EXTERNAL_METHODS = {"hf-pld": "transformers generate(prompt_lookup_num_tokens=10)"}
AUTO_MAX_BUDGET = 128
REFERENCE = "hf-greedy"  # the audit's reference run, reported as a row for context


@dataclass
class BenchConfig(Workload):
    """One benchmark run."""

    methods: str = "ar,pld"
    """Comma-separated methods to run; 'ar' is always added as the speed baseline. 'hf-pld' runs transformers' own prompt lookup."""
    budget: str = "64"
    """Tree nodes per verification forward, root included: a number (fixed, e.g. 60 for paper-faithful comparisons), 'auto' (chosen per forward from this device's measured cost curve and the observed acceptance, up to 128), or a comma list such as '60,auto' (every method runs at each, as rows 'method@60', 'method@auto', against one shared 'ar')."""
    warmup: int = 1
    """Requests run (untimed, with throw-away drafters) before measuring."""
    audit: bool = True
    """Check every output token for token against transformers generate(do_sample=False)."""
    grade: bool = True
    """Grade the answers of requests with a checkable reference (GSM8K: Spec-Bench math_reasoning; HumanEval: its tests, run in a subprocess) and report accuracy per method."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.warmup < 0:
            raise ValueError(f"--warmup must be >= 0, got {self.warmup}")
        for budget in self.budgets():
            if budget != "auto" and not (budget.isdigit() and int(budget) >= 1):
                raise ValueError(f"--budget must be positive integers or 'auto', got {self.budget!r}")
            DecodeConfig(self.max_new_tokens, node_budget(budget))  # validates both

    def budgets(self) -> list[str]:
        """The budgets to run, in the order given ('60,auto' -> ['60', 'auto'])."""
        out = list(dict.fromkeys(b.strip() for b in str(self.budget).split(",") if b.strip()))
        if not out:
            raise ValueError("--budget must name at least one budget")
        return out

    def method_list(self) -> list[str]:
        """The method specs to run, 'ar' first, each known and each override valid.

        A spec is `name`, `name@budget`, or `name[field=value;...]` (with an optional
        `@budget`): the drafter with those config fields changed, e.g.
        'oilbird[sem_entry_budget=0]'. Specs are separated by commas outside brackets.

        Raises:
            ConfigError: for an unknown method or field, or a bad value, naming what is known.
        """
        names = split_methods(self.methods)
        known = sorted(DRAFTERS) + sorted(EXTERNAL_METHODS)
        for name in names:
            spec, _, budget = name.partition("@")
            method, overrides = parse_spec(spec)
            if method not in known:
                raise ConfigError(f"unknown method {method!r}; known methods: {', '.join(known)}")
            if fly_config(spec) is not None and method not in DRAFTERS:
                raise ConfigError(f"{name!r}: FLy verifies drafts; only drafters take '{FLY}'")
            if "@" in name and (method not in DRAFTERS or not (budget == "auto" or budget.isdigit() and int(budget) >= 1)):
                raise ConfigError(f"{name!r}: only drafters take a budget, as name@N or name@auto")
            if overrides:
                if method not in DRAFTERS:
                    raise ConfigError(f"{name!r}: only drafters take config overrides")
                configure(method, None, overrides)  # validates fields and values now
        return ["ar"] + [m for m in dict.fromkeys(names) if m != "ar"]

    def variants(self) -> list[tuple[str, str, str]]:
        """(row label, method spec, budget) for every run: each drafter at each budget.

        With one budget the label is the spec; with several it is 'spec@budget'.
        'ar' (nothing to draft) and external methods run once, at the first budget. A method
        given as 'spec@budget' runs at that budget only.
        """
        budgets = self.budgets()
        out = []
        for method in self.method_list():
            if "@" in method:
                name, _, budget = method.partition("@")
                out.append((method, name, budget))
            elif method == "ar" or parse_spec(method)[0] not in DRAFTERS or len(budgets) == 1:
                out.append((method, method, budgets[0]))
            else:
                out.extend((f"{method}@{b}", method, b) for b in budgets)
        return out


def split_methods(text: str) -> list[str]:
    """Split a methods list on commas that are not inside [...] overrides."""
    parts, depth, current = [], 0, ""
    for ch in text:
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


FLY = "+fly"  # method suffix: verify with FLy's loose (lossy) rule, e.g. 'draft+fly[fly_window=4]'


def _split_spec(spec: str) -> tuple[str, dict[str, str]]:
    """'oilbird[sem_theta=0.6;sem_floor=false]' -> ('oilbird', {'sem_theta': '0.6', ...}), all overrides."""
    if "[" not in spec:
        return spec.strip(), {}
    method, _, rest = spec.partition("[")
    if not rest.endswith("]"):
        raise ConfigError(f"{spec!r}: overrides go in one trailing [field=value;...]")
    overrides = {}
    for item in filter(None, (x.strip() for x in rest[:-1].split(";"))):
        key, eq, value = item.partition("=")
        if not eq:
            raise ConfigError(f"{spec!r}: override {item!r} is not field=value")
        overrides[key.strip()] = value.strip()
    return method.strip(), overrides


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """The drafter of a method spec and its config overrides.

    'oilbird[sem_theta=0.6;sem_floor=false]' -> ('oilbird', {'sem_theta': '0.6', ...}). FLy's
    part ('+fly' and 'fly_*' overrides, see `fly_config`) is left out: 'draft+fly[k=10;fly_window=4]'
    -> ('draft', {'k': '10'}).

    Raises:
        ConfigError: for unbalanced brackets or an override without '='.
    """
    method, overrides = _split_spec(spec)
    return method.removesuffix(FLY), {k: v for k, v in overrides.items() if not k.startswith("fly_")}


def fly_config(spec: str) -> FlyConfig | None:
    """FLy's config of a method spec: None unless the method ends with '+fly'.

    'draft+fly[fly_theta=0.6;fly_window=4]' -> FlyConfig(theta=0.6, window=4).

    Raises:
        ConfigError: for 'fly_*' overrides without '+fly', an unknown field or a bad value.
    """
    method, overrides = _split_spec(spec)
    fly = {k.removeprefix("fly_"): v for k, v in overrides.items() if k.startswith("fly_")}
    if not method.endswith(FLY):
        if fly:
            raise ConfigError(f"{spec!r}: fly_* overrides need the FLy rule: write {method}{FLY}[...]")
        return None
    return _override(FlyConfig(), fly, f"{spec!r}", prefix="fly_")


def configure(method: str, base, overrides: dict[str, str]):
    """`method`'s config: `base` (or the defaults) with `overrides` (field -> text) applied.

    Raises:
        ConfigError: for a field the config does not have, or a value it rejects.
    """
    config = base if base is not None else DRAFTERS[method].Config()
    return _override(config, overrides, method)


def _override(config, overrides: dict[str, str], label: str, prefix: str = ""):
    """`config` with `overrides` (field -> text, parsed by the field's type) applied.

    `label` names the owner in messages; `prefix` is how the fields are spelt in a spec.

    Raises:
        ConfigError: for a field the config does not have, or a value it rejects.
    """
    if not overrides:
        return config
    types = field_types(type(config))
    values = {}
    for key, text in overrides.items():
        if key not in types:
            raise ConfigError(f"{label} has no config field {prefix + key!r}; "
                              f"fields: {', '.join(prefix + t for t in types)}")
        kind = parse_bool if types[key] is bool else types[key]
        try:
            values[key] = kind(text)
        except (ValueError, ArgumentTypeError):
            raise ConfigError(f"{label}[{prefix}{key}={text}]: expected {types[key].__name__}") from None
    try:
        return replace(config, **values)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{label}: {err}") from None


def build_drafter(spec: str, drafter_configs: dict, target: LoadedModel | None = None,
                  models: dict | None = None):
    """A fresh drafter for a method spec (see `BenchConfig.method_list`), attached to `target`.

    `models` memoises drafter models across the drafters of one run (see `Drafter.attach`).
    """
    method, overrides = parse_spec(spec)
    drafter = make_drafter(method, configure(method, drafter_configs.get(method), overrides))
    if target is not None:
        drafter.attach(target, models)
    return drafter


def node_budget(budget: str) -> int:
    """The cap on tree size: the fixed budget, or the largest candidate in 'auto' mode."""
    return AUTO_MAX_BUDGET if budget == "auto" else int(budget)


def encode_request(loaded: LoadedModel, request) -> list[int]:
    """Token ids of a dataset request (raw prompt, or chat through the template)."""
    if request.prompt is not None:
        return loaded.encode_text(request.prompt)
    return loaded.encode_chat(list(request.messages), list(request.tools) if request.tools else None)


def run_bench(loaded: LoadedModel, config: BenchConfig, drafter_configs: dict | None = None,
              out_dir: Path | None = None, progress: bool = True,
              verifier_config: VerifierConfig | None = None,
              budget_config: BudgetConfig | None = None) -> dict:
    """Run the benchmark and return the summary (also written to `out_dir` when given).

    Args:
        loaded: the target model.
        config: what to run.
        drafter_configs: method name -> config instance (default: each drafter's paper defaults).
        out_dir: where to write records.jsonl, summary.json and table.md (None: do not write).
        progress: show a progress bar on stderr.
        verifier_config: what each forward exposes to drafters (default: VerifierConfig()).
        budget_config: candidate sizes and exploration of the 'auto' budget (default:
            BudgetConfig(mode="auto")).

    Returns:
        The summary dict: per-method rows, the table, and the run's environment.

    Raises:
        DatasetError, PromptError, ConfigError: on bad input, before anything is decoded.
    """
    drafter_configs = drafter_configs or {}
    variants = config.variants()  # (label, method, budget)
    methods = [label for label, _, _ in variants]
    requests = config.requests()
    prompts = [encode_request(loaded, r) for r in requests]
    for request, ids in zip(requests, prompts):  # refuse bad prompts before spending any time
        try:
            check_prompt(ids, loaded.max_context)
        except Exception as err:
            raise type(err)(f"request {request.id}: {err}") from None

    verifier = TreeVerifier(loaded.model, loaded.stop_ids, verifier_config or VerifierConfig())
    # FLy methods verify with the loose rule: a verifier of their own (lossy, never audited as lossless).
    fly_verifiers = {spec.partition("@")[0]: TreeVerifier(loaded.model, loaded.stop_ids,
                                                           verifier_config or VerifierConfig(), fly=fly)
                     for _, spec, _ in variants if (fly := fly_config(spec.partition("@")[0])) is not None}

    curve, budget_config = None, budget_config or BudgetConfig(mode="auto")
    if any(budget == "auto" for _, _, budget in variants):
        curve = load_or_measure(loaded, budget_config, default_cache_dir(), log=lambda m: None)

    def new_policy(method: str, budget: str) -> AdaptiveBudget | None:
        # One policy per drafter instance: its acceptance estimate is that drafter's own.
        if budget != "auto" or method == "ar" or parse_spec(method)[0] not in DRAFTERS:
            return None
        return AdaptiveBudget(curve, budget_config, AUTO_MAX_BUDGET)

    def run(method: str, budget: str, drafter, ids: list[int], request_id: str, limit: int,
            policy: AdaptiveBudget | None = None) -> dict:
        if method == "hf-pld":
            res = hf_prompt_lookup(loaded.model, ids, limit, loaded.stop_ids)
            return dict(output_ids=res.output_ids, forwards=res.forwards, wall_s=res.wall_s,
                        prefill_s=None, draft_s=None, forward_s=None, bookkeeping_s=None,
                        finish_reason=None, excess_tokens=0, accepted_drafts=None,
                        accepted_sources={}, sole_sources={},
                        committed_per_forward=None, nodes_per_forward=None)
        res = decode(fly_verifiers.get(method, verifier), drafter, ids, DecodeConfig(limit, node_budget(budget)),
                     max_context=loaded.max_context, request_id=request_id,
                     tenant=config.dataset,  # one pool per dataset, as the papers serve them
                     budget_policy=policy)
        return dict(output_ids=res.output_ids, forwards=res.forwards, wall_s=res.wall_s,
                    prefill_s=res.prefill_s, draft_s=res.draft_s, forward_s=res.forward_s,
                    bookkeeping_s=res.bookkeeping_s, finish_reason=res.finish_reason,
                    excess_tokens=res.excess_tokens, accepted_drafts=res.accepted_drafts,
                    accepted_sources=res.accepted_sources, sole_sources=res.sole_sources,
                    committed_per_forward=res.committed_per_forward,
                    nodes_per_forward=res.nodes_per_forward, drafter_stats=res.drafter_stats,
                    lossy=res.lossy, forgiven_positions=res.forgiven_positions)

    drafter_models: dict = {}  # drafter LLMs ('draft' method), loaded once per run
    # Warm-up: throw-away drafters, so nothing reaches the measured drafters' pools.
    for ids in prompts[: config.warmup]:
        greedy_reference(loaded.model, ids, min(8, config.max_new_tokens), loaded.stop_ids)
        for _, method, budget in variants:
            drafter = (build_drafter(method, drafter_configs, loaded, drafter_models)
                       if parse_spec(method)[0] in DRAFTERS else None)
            run(method, budget, drafter, ids, "warmup", min(8, config.max_new_tokens),
                new_policy(method, budget))

    drafters = {label: build_drafter(m, drafter_configs, loaded, drafter_models) for label, m, _ in variants
                if parse_spec(m)[0] in DRAFTERS}
    policies = {label: p for label, m, b in variants if (p := new_policy(m, b)) is not None}
    records: list[dict] = []
    sink = None
    if out_dir is not None:  # records are written as they come, so a cut run keeps its data
        out_dir.mkdir(parents=True, exist_ok=True)
        sink = open(out_dir / "records.jsonl", "w")
        # The run's settings now, so `oilbird report` describes a run still in progress correctly.
        (out_dir / "config.json").write_text(json.dumps(asdict(config), indent=2) + "\n")

    def emit(record: dict) -> None:
        records.append(record)
        if sink is not None:
            sink.write(json.dumps(record) + "\n")
            sink.flush()

    grader = Grader()
    bar = tqdm(list(zip(requests, prompts)), desc=f"bench {config.dataset}", unit="req",
               disable=not progress, file=sys.stderr)
    interrupted = False
    try:
        for request, ids in bar:
            ref = greedy_reference(loaded.model, ids, config.max_new_tokens, loaded.stop_ids) \
                if config.audit else None
            request_records = []
            if ref is not None:
                request_records.append(_record(REFERENCE, request, ids, dict(
                    output_ids=ref.output_ids, forwards=len(ref.output_ids), wall_s=ref.wall_s),
                    audit=None))
            greedy = (REFERENCE, ref.output_ids) if ref is not None else None
            for label, method, budget in variants:
                res = run(method, budget, drafters.get(label), ids, request.id, config.max_new_tokens,
                          policies.get(label))
                if method == "ar" and greedy is None:  # no audit: 'ar' (runs first) is greedy's output
                    greedy = ("ar", res["output_ids"])
                audit = None
                if res.get("lossy"):  # FLy: not lossless by design; count what differs instead
                    if greedy is not None:
                        res["differs"] = dict(asdict(differences(res["output_ids"], greedy[1])),
                                              against=greedy[0])
                elif ref is not None:
                    audit = asdict(compare(res["output_ids"], ref))
                if config.grade and gradable(request):
                    res["correct"] = grader.grade(request, loaded.decode(res["output_ids"]))
                request_records.append(_record(label, request, ids, res, audit))
            for record in request_records:  # whole requests only: every method saw the same ones
                emit(record)
    except KeyboardInterrupt:  # Ctrl-C: keep and summarise the requests that finished
        interrupted = True
    bar.close()
    if sink is not None:
        sink.close()
    if not records:
        raise KeyboardInterrupt

    rows = summarize(records, [REFERENCE] * config.audit + methods)
    for row in rows:  # pool/table memory at the end of the run
        row["memory_bytes"] = drafters[row["method"]].memory_bytes() if row["method"] in drafters else None
    summary = dict(config=asdict(config), interrupted=interrupted,
                   requests_served=len({r["request_id"] for r in records}),
                   budget_curve=curve.to_json() if curve else None,
                   drafters={m: d.describe() for m, d in drafters.items()},
                   model=dict(name=loaded.name, source=loaded.source),
                   environment=environment(loaded), rows=rows,
                   table=format_table(rows, config))
    if out_dir is not None:
        (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        (out_dir / "table.md").write_text(summary["table"] + "\n")
    return summary


def _record(method: str, request, ids: list[int], res: dict, audit: dict | None) -> dict:
    out = res["output_ids"]
    return dict(method=method, request_id=request.id, category=request.category,
                prompt_len=len(ids), new_tokens=len(out),
                tau=len(out) / res["forwards"] if res["forwards"] else None,
                audit=audit, **res)


def summarize(records: list[dict], methods: list[str]) -> list[dict]:
    """Pool the records of each method: τ, tokens/s, speedup vs 'ar', audit, time shares."""
    rows = []
    for method in methods:
        recs = [r for r in records if r["method"] == method]
        tokens = sum(r["new_tokens"] for r in recs)
        forwards = sum(r["forwards"] for r in recs)
        wall = sum(r["wall_s"] for r in recs)
        row = dict(method=method, requests=len(recs), new_tokens=tokens, forwards=forwards,
                   tau=tokens / forwards if forwards else 0.0,
                   tokens_per_s=tokens / wall if wall else 0.0, wall_s=wall)
        audited = [r for r in recs if r.get("audit") is not None]
        row["audited"] = len(audited)
        row["lossless"] = sum(r["audit"]["lossless"] for r in audited)
        row["divergences"] = [dict(request_id=r["request_id"], **r["audit"])
                              for r in audited if not r["audit"]["lossless"]]
        cycle = sum((r.get("draft_s") or 0) + (r.get("forward_s") or 0) + (r.get("bookkeeping_s") or 0)
                    for r in recs)
        has_split = recs and all(r.get("draft_s") is not None for r in recs)
        row["draft_share"] = sum(r["draft_s"] for r in recs) / cycle if has_split and cycle else None
        row["bookkeeping_share"] = (sum(r["bookkeeping_s"] for r in recs) / cycle
                                    if has_split and cycle else None)
        # Per-source attribution over accepted draft tokens (bonus tokens excluded).
        drafts = sum(r.get("accepted_drafts") or 0 for r in recs)
        row["accepted_drafts"] = drafts
        row["source_share"], row["sole_source_share"] = {}, {}
        for key, out in (("accepted_sources", row["source_share"]),
                         ("sole_sources", row["sole_source_share"])) if drafts else ():
            for r in recs:
                for source, count in (r.get(key) or {}).items():
                    out[source] = out.get(source, 0) + count
            for source in out:
                out[source] = out[source] / drafts if drafts else 0.0
        row["semantic"] = _semantic_stats(recs)
        graded = [r["correct"] for r in recs if r.get("correct") is not None]
        row["graded"], row["correct"] = len(graded), sum(graded)
        row["accuracy"] = sum(graded) / len(graded) if graded else None
        row["graded_ids"] = {r["request_id"]: r["correct"] for r in recs if r.get("correct") is not None}
        lossy = [r for r in recs if r.get("lossy")]
        row["lossy"] = bool(lossy)
        if lossy:  # FLy: how far from greedy decoding the loose rule took the outputs
            compared = [r["differs"] for r in lossy if r.get("differs")]
            row["forgiven"] = sum(len(r.get("forgiven_positions") or []) for r in lossy)
            row["compared"] = len(compared)
            row["requests_differing"] = sum(d["tokens"] > 0 for d in compared)
            row["tokens_differing"] = sum(d["tokens"] for d in compared)
        # Decode phase only: the prefill is identical across methods and dilutes the ratio.
        row["decode_tokens_per_s"] = tokens / cycle if has_split and cycle else None
        rows.append(row)
    base = next((r for r in rows if r["method"] == "ar"), None)
    for row in rows:
        # Recovery: accuracy relative to strict verification, whose output is greedy decoding's ('ar').
        row["recovery"] = (row["accuracy"] / base["accuracy"] if base and row["accuracy"] is not None
                           and base.get("accuracy") else None)
        # Paired with ar, request by request: on a few dozen questions the ratio above is noisy,
        # the answers FLy turned wrong (lost) or right (gained) say more.
        both = [i for i in row["graded_ids"] if base and i in base["graded_ids"]]
        row["lost"] = sum(base["graded_ids"][i] and not row["graded_ids"][i] for i in both) if both else None
        row["gained"] = sum(row["graded_ids"][i] and not base["graded_ids"][i] for i in both) if both else None
        row["speedup"] = row["tokens_per_s"] / base["tokens_per_s"] if base and base["tokens_per_s"] else None
        row["decode_speedup"] = (row["decode_tokens_per_s"] / base["decode_tokens_per_s"]
                                 if base and row["decode_tokens_per_s"] and base["decode_tokens_per_s"]
                                 else None)
    for row in rows:  # per-request grades were only needed for the pairing: keep summaries small
        del row["graded_ids"]
    return rows


def _semantic_stats(recs: list[dict]) -> dict | None:
    """Pooled semantic-source measurements of a method (None for methods without the source)."""
    stats = [r["drafter_stats"] for r in recs if (r.get("drafter_stats") or {}).get("cycles") is not None
             and "retrieve_s" in r["drafter_stats"]]
    if not stats:
        return None
    cycles = sum(s["cycles"] for s in stats)
    paid = sum(s["sem_paid"] for s in stats)
    cycle_s = sum((r.get("draft_s") or 0) + (r.get("forward_s") or 0) + (r.get("bookkeeping_s") or 0)
                  for r in recs)
    upkeep = sum(s["retrieve_s"] + s["merge_s"] + s["harvest_s"] for s in stats)
    return dict(cycles=cycles, fired_share=sum(s["fired"] for s in stats) / cycles if cycles else 0.0,
                retrieve_ms_per_cycle=1e3 * sum(s["retrieve_s"] for s in stats) / cycles if cycles else 0.0,
                merge_ms_per_cycle=1e3 * sum(s["merge_s"] for s in stats) / cycles if cycles else 0.0,
                harvest_ms_per_cycle=1e3 * sum(s["harvest_s"] for s in stats) / cycles if cycles else 0.0,
                share_of_cycle=upkeep / cycle_s if cycle_s else 0.0,
                paid_nodes=paid, paid_accepted=sum(s["sem_paid_accepted"] for s in stats),
                store_records=stats[-1]["store_records"], bytes_per_record=stats[-1]["bytes_per_record"],
                theta_end=stats[-1].get("theta"), faiss=any(s.get("faiss") for s in stats))


def format_table(rows: list[dict], config: BenchConfig) -> str:
    """A Markdown table of the summary rows."""
    def pct(x):
        return "–" if x is None else f"{100 * x:.1f}%"

    lines = ["| method | requests | tokens | forwards | τ | tokens/s | speedup vs ar | decode speedup | lossless | draft % | bookkeeping % |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        if r["method"] == REFERENCE:
            audit = "reference"
        elif r.get("lossy"):  # never counted as lossless: how many requests left greedy's output
            audit = (f"LOSSY: {r['requests_differing']}/{r['compared']} differ" if r.get("compared")
                     else "LOSSY")
        else:
            audit = f"{r['lossless']}/{r['audited']}" if r["audited"] else "not audited"
        speedup = "–" if r["speedup"] is None else f"{r['speedup']:.2f}x"
        decode_speedup = "–" if r["decode_speedup"] is None else f"{r['decode_speedup']:.2f}x"
        lines.append(f"| {r['method']} | {r['requests']} | {r['new_tokens']} | {r['forwards']} | "
                     f"{r['tau']:.2f} | {r['tokens_per_s']:.1f} | {speedup} | {decode_speedup} | {audit} | "
                     f"{pct(r['draft_share'])} | {pct(r['bookkeeping_share'])} |")
    graded = [r for r in rows if r.get("graded")]
    if graded:
        lines.append("")
        lines.append("Accuracy of the answers (GSM8K: the final number; HumanEval: pass@1 of its tests); "
                     "recovery = accuracy / accuracy of ar (strict verification gives greedy's output):")
        for r in graded:
            recovery = "" if r["recovery"] is None else f", recovery {100 * r['recovery']:.1f}%"
            if r["method"] != "ar" and r.get("lost") is not None:
                recovery += f" (vs ar, request by request: {r['lost']} lost, {r['gained']} gained)"
            lines.append(f"- {r['method']}: {r['correct']}/{r['graded']} = {100 * r['accuracy']:.1f}%{recovery}")
    shares = [r for r in rows if r.get("source_share")]
    if shares:
        lines.append("")
        lines.append("Accepted draft tokens by source (share of all accepted drafts; sole = only that "
                     "source proposed it; bonus tokens excluded):")
        for r in shares:
            parts = [f"{s} {100 * v:.1f}% (sole {100 * r['sole_source_share'].get(s, 0.0):.1f}%)"
                     for s, v in sorted(r["source_share"].items())]
            memory = r.get("memory_bytes")
            mem = f"; pool/table memory {memory / 2**20:.1f} MiB" if memory else ""
            lines.append(f"- {r['method']}: " + ", ".join(parts) + mem)
    semantic = [r for r in rows if r.get("semantic")]
    if semantic:
        lines.append("")
        lines.append("Semantic source (per drafting cycle; share = retrieval + merge + harvest of the "
                     "decode cycle; acceptance = accepted / paid semantic nodes):")
        for r in semantic:
            s = r["semantic"]
            lines.append(
                f"- {r['method']}: fired in {100 * s['fired_share']:.0f}% of cycles; retrieval "
                f"{s['retrieve_ms_per_cycle']:.2f} ms, merge {s['merge_ms_per_cycle']:.2f} ms, harvest "
                f"{s['harvest_ms_per_cycle']:.2f} ms ({100 * s['share_of_cycle']:.1f}% of the cycle); "
                f"{s['paid_nodes']} nodes paid, {100 * s['paid_accepted'] / max(1, s['paid_nodes']):.1f}% "
                f"accepted; store {s['store_records']} records x {s['bytes_per_record']} B"
                + (" (FAISS)" if s["faiss"] else ""))
    lines.append("")
    lines.append(f"{config.dataset}, {config.max_new_tokens} new tokens max, node budget "
                 f"{config.budget}. τ = Σ committed / Σ verification forwards (prefill not "
                 "counted: it commits no token). tokens/s pooled over requests, prefill included; decode "
                 "speedup leaves the prefill out (our loop only). draft % and bookkeeping % are "
                 "shares of the decode cycle (draft + forward + bookkeeping). "
                 f"{REFERENCE} = transformers generate(do_sample=False), the audit reference; "
                 f"'{FLY}' rows verify with FLy's loose rule: LOSSY by design, left out of the audit, with the "
                 "number of requests whose output differs from greedy decoding; "
                 "hf-pld forwards = all model calls of generate(prompt_lookup_num_tokens=10).")
    return "\n".join(lines)


def read_records(run_dir: Path) -> list[dict]:
    """The records of an `oilbird bench --out run_dir` run, in serving order.

    Raises:
        DatasetError: the directory holds no records, or an empty file.
    """
    path = run_dir / "records.jsonl"
    if not path.exists():
        raise DatasetError(f"no benchmark records at {path}; run `oilbird bench --out {run_dir}` first")
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not records:
        raise DatasetError(f"{path} is empty: the run was stopped before its first request")
    return records


def report(run_dir: Path, by_category: bool = False, first: int | None = None,
           method: str | None = None) -> str:
    """Markdown tables re-made from a run's records.jsonl (all requests, or one per category).

    `first` keeps only the first N requests served (the records are in serving order).
    With `by_category` and `method`, one compact table: a row per category for that method.

    Raises:
        DatasetError: if the run directory holds no records.
    """
    records = read_records(run_dir)
    if first is not None:
        keep = set(list(dict.fromkeys(r["request_id"] for r in records))[:first])
        records = [r for r in records if r["request_id"] in keep]
    summary_path, config_path = run_dir / "summary.json", run_dir / "config.json"
    saved = (json.loads(summary_path.read_text())["config"] if summary_path.exists()
             else json.loads(config_path.read_text()) if config_path.exists() else {})
    if "node_budget" in saved:  # summaries written before --budget replaced --node-budget
        saved["budget"] = str(saved.pop("node_budget"))
    known = {f.name for f in fields(BenchConfig)}
    config = BenchConfig(**{k: v for k, v in saved.items() if k in known})
    methods = list(dict.fromkeys(r["method"] for r in records))
    groups = sorted({r["category"] or "" for r in records}) if by_category else [None]
    if by_category and method:
        lines = [f"| category | requests | τ ({method}) | speedup vs ar | decode speedup | lossless ar / {method} |",
                 "| --- | ---: | ---: | ---: | ---: | ---: |"]
        for group in groups:
            rows = {r["method"]: r for r in summarize(
                [r for r in records if (r["category"] or "") == group], methods)}
            if method not in rows or "ar" not in rows:
                raise DatasetError(f"the run has no {method!r} or 'ar' records")
            m, ar = rows[method], rows["ar"]
            decode = "–" if m["decode_speedup"] is None else f"{m['decode_speedup']:.2f}x"
            lines.append(f"| {group} | {m['requests']} | {m['tau']:.2f} | {m['speedup']:.2f}x | {decode} | "
                         f"{ar['lossless']}/{ar['audited']} / {m['lossless']}/{m['audited']} |")
        return "\n".join(lines)
    parts = []
    for group in groups:
        recs = [r for r in records if group is None or (r["category"] or "") == group]
        if group is not None:
            parts.append(f"### {group} ({len({r['request_id'] for r in recs})} requests)\n")
        parts.append(format_table(summarize(recs, methods), config))
    return "\n\n".join(parts)


def environment(loaded: LoadedModel) -> dict:
    """Where the numbers were measured."""
    import transformers

    return dict(machine=platform.machine(), processor=platform.processor() or platform.machine(),
                cpus=os.cpu_count(), python=platform.python_version(), torch=torch.__version__,
                transformers=transformers.__version__, device=str(loaded.device),
                threads=torch.get_num_threads(), time=time.strftime("%Y-%m-%d %H:%M:%S %Z"))
