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
- Output: a Markdown table on stdout (`tables.py`); `config.json` (the run's settings, written
  first); `records.jsonl` (one record per request and method, written when the request has run
  under every method) and `summary.json` (rows pooled by `summary.py`) in the output directory.
  Ctrl-C (or SIGTERM, from `oilbird bench`) stops serving and still summarizes the requests
  that finished. `summary["audit_failed"]` names the strict methods whose output diverged.
- Method specs ('oilbird[sem_theta=0.6]@auto', 'draft+fly') are `methods.py`'s language.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from oilbird.accuracy import Grader, gradable
from oilbird.audit import compare, differences, greedy_reference, hf_prompt_lookup
from oilbird.budget import AdaptiveBudget, BudgetConfig
from oilbird.cost_curve import CostCurve, load_or_measure
from oilbird.prefix_cache import PrefixCache, PrefixCacheConfig
from oilbird.tree_select import FittedTree
from oilbird.datasets import Workload
from oilbird.decode import DecodeConfig, check_prompt, decode
from oilbird.kernels import ForwardConfig, describe_kernels
from oilbird.sampling import SamplingConfig
from oilbird.methods import build_drafter, check_spec, fly_config, is_drafter, split_methods
from oilbird.models import LoadedModel, default_cache_dir
from oilbird.summary import REFERENCE, audit_failures, summarize
from oilbird.tables import format_table
from oilbird.verifier import TreeVerifier, VerifierConfig

AUTO_MAX_BUDGET = 128
FIT_PROPOSAL_BUDGET = 64
MEASURED_BUDGETS = ("auto", "fit")  # budgets that read this device's cost curve


@dataclass
class BenchConfig(Workload):
    """One benchmark run."""

    methods: str = "ar,pld"
    """Comma-separated methods to run; 'ar' is always added as the speed baseline. 'hf-pld' runs transformers' own prompt lookup."""
    budget: str = "64"
    """Tree nodes per verification forward, root included: a number (fixed, e.g. 60 for paper-faithful comparisons), 'auto' (chosen per forward from this device's measured cost curve and the observed acceptance, up to 128), 'fit' (of each proposal of up to 64 nodes, the subtree whose estimated reach best pays for its forward on that curve; oilbird/tree_select.py), or a comma list such as '60,auto' (every method runs at each, as rows 'method@60', 'method@auto', against one shared 'ar')."""
    warmup: int = 1
    """Requests run (untimed, with throw-away drafters) before measuring."""
    audit: bool = True
    """Check every output token for token against transformers generate(do_sample=False)."""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    """Greedy (temperature 0, audited token for token) or sampled (the distribution check replaces the audit)."""
    prefix_cache: bool = True
    """Reuse, per method and tenant, the KV of the previous request's prefix shared with the new prompt, as vLLM's prefix caching does (false: every method prefills each prompt whole; the audit's generate() reference always does)."""
    grade: bool = True
    """Grade the answers of requests with a checkable reference (GSM8K: Spec-Bench math_reasoning; HumanEval: its tests, run in a subprocess) and report accuracy per method."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.warmup < 0:
            raise ValueError(f"--warmup must be >= 0, got {self.warmup}")
        for budget in self.budgets():
            if budget not in MEASURED_BUDGETS and not (budget.isdigit() and int(budget) >= 1):
                raise ValueError(f"--budget must be positive integers, 'auto' or 'fit', got {self.budget!r}")
            DecodeConfig(self.max_new_tokens, node_budget(budget))  # validates both
        if not self.sampling.greedy:
            unsampled = [m for m in split_methods(self.methods) if m == "hf-pld" or fly_config(m)]
            if unsampled:
                raise ValueError(f"{', '.join(unsampled)} decode(s) greedily only; leave them out "
                                 "of a sampled run (temperature > 0) or sample at temperature 0")

    def budgets(self) -> list[str]:
        """The budgets to run, in the order given ('60,auto' -> ['60', 'auto'])."""
        out = list(dict.fromkeys(b.strip() for b in str(self.budget).split(",") if b.strip()))
        if not out:
            raise ValueError("--budget must name at least one budget")
        return out

    def method_list(self) -> list[str]:
        """The method specs to run (see `oilbird.methods`), 'ar' first, each checked.

        Raises:
            ConfigError: for an unknown method or field, or a bad value, naming what is known.
        """
        names = split_methods(self.methods)
        for name in names:
            check_spec(name)
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
            elif method == "ar" or not is_drafter(method) or len(budgets) == 1:
                out.append((method, method, budgets[0]))
            else:
                out.extend((f"{method}@{b}", method, b) for b in budgets)
        return out


def node_budget(budget: str) -> int:
    """The cap on tree size: the fixed budget, the largest candidate in 'auto' mode, or the
    proposal's budget in 'fit' mode."""
    return {"auto": AUTO_MAX_BUDGET, "fit": FIT_PROPOSAL_BUDGET}.get(budget) or int(budget)


def encode_request(loaded: LoadedModel, request) -> list[int]:
    """Token ids of a dataset request (raw prompt, or chat through the template)."""
    if request.prompt is not None:
        return loaded.encode_text(request.prompt)
    return loaded.encode_chat(list(request.messages), list(request.tools) if request.tools else None)


def encode_requests(loaded: LoadedModel, requests: list) -> list[list[int]]:
    """Every request's prompt ids, refusing a bad prompt before any time is spent.

    Raises:
        PromptError: naming the request whose prompt is empty or does not fit the context.
    """
    prompts = [encode_request(loaded, r) for r in requests]
    for request, ids in zip(requests, prompts):
        try:
            check_prompt(ids, loaded.max_context)
        except Exception as err:
            raise type(err)(f"request {request.id}: {err}") from None
    return prompts


class Harness:
    """What one run shares across requests: verifiers, cost curves, budget policies, drafters.

    Args:
        loaded: the target model.
        config: the run.
        drafter_configs: method name -> base config.
        verifier_config: what each forward exposes to drafters.
        budget_config: the 'auto' budget's candidates and exploration.
    """

    def __init__(self, loaded: LoadedModel, config: BenchConfig, drafter_configs: dict,
                 verifier_config: VerifierConfig, budget_config: BudgetConfig,
                 forward_config: ForwardConfig | None = None) -> None:
        self.loaded, self.config, self.drafter_configs = loaded, config, drafter_configs
        self.budget_config = budget_config
        self.variants = config.variants()  # (label, spec, budget)
        # Every method decodes with the fast kernels; the audit's reference runs on loaded.model.
        model = loaded.tree_model(forward_config)
        self.verifier = TreeVerifier(model, loaded.stop_ids, verifier_config)
        # FLy methods verify with the loose rule: a verifier of their own (lossy, never audited as lossless).
        self.verifiers = {spec: TreeVerifier(model, loaded.stop_ids, verifier_config, fly=fly)
                          for _, spec, _ in self.variants if (fly := fly_config(spec)) is not None}
        # 'auto' budgets need the cost of the very verifier their method runs with: one curve
        # per verifier (the strict one, or a FLy spec's own), shared by its methods.
        self.curves: dict[str, CostCurve] = {}
        measured: dict[int, CostCurve] = {}  # id(verifier) -> its curve
        for _, spec, budget in self.variants:
            verifier = self.verifier_of(spec)
            if budget in MEASURED_BUDGETS and id(verifier) not in measured:
                measured[id(verifier)] = load_or_measure(loaded, verifier, budget_config, default_cache_dir(),
                                                         log=lambda m: print(f"oilbird: {m}", file=sys.stderr))
            if budget in MEASURED_BUDGETS:
                self.curves[spec] = measured[id(verifier)]
        self.models: dict = {}  # drafter LLMs ('draft' method), loaded once per run
        self.drafters = {label: self.new_drafter(spec) for label, spec, _ in self.variants if is_drafter(spec)}
        self.policies = {label: p for label, spec, b in self.variants if (p := self.new_policy(spec, b))}
        # Each method pays for its own prefills: one prefix cache per row, as one per drafter.
        self.prefix_caches = {label: PrefixCache(PrefixCacheConfig(enabled=config.prefix_cache))
                              for label, _, _ in self.variants}

    def verifier_of(self, spec: str) -> TreeVerifier:
        return self.verifiers.get(spec, self.verifier)

    def new_drafter(self, spec: str):
        return build_drafter(spec, self.drafter_configs, self.loaded, self.models)

    def new_policy(self, spec: str, budget: str) -> AdaptiveBudget | FittedTree | None:
        """One policy per drafter instance: its acceptance estimate is that drafter's own."""
        if budget not in MEASURED_BUDGETS or spec == "ar" or not is_drafter(spec):
            return None
        if budget == "fit":
            options = self.budget_config
            return FittedTree(self.curves[spec], FIT_PROPOSAL_BUDGET, use_context=options.fit_context,
                              objective=options.fit_objective, explore_every=options.fit_explore_every,
                              explore_nodes=options.fit_explore_nodes, use_shape=options.fit_shape,
                              extend_trials=options.fit_extend_trials)
        return AdaptiveBudget(self.curves[spec], self.budget_config, AUTO_MAX_BUDGET)

    def run(self, spec: str, budget: str, drafter, ids: list[int], request_id: str, limit: int,
            policy: AdaptiveBudget | FittedTree | None = None, prefix_cache: PrefixCache | None = None) -> dict:
        """Serve one request with one method; the record's measured fields."""
        if spec == "hf-pld":
            res = hf_prompt_lookup(self.loaded.model, ids, limit, self.loaded.stop_ids)
            return dict(output_ids=res.output_ids, forwards=res.forwards, wall_s=res.wall_s)
        result = decode(self.verifier_of(spec), drafter, ids,
                        DecodeConfig(limit, node_budget(budget), sampling=self.config.sampling),
                        max_context=self.loaded.max_context, request_id=request_id,
                        tenant=self.config.dataset,  # one pool per dataset, as the papers serve them
                        budget_policy=policy, prefix_cache=prefix_cache)
        return dict(asdict(result), forwards=result.forwards)

    def warm_up(self, prompts: list[list[int]]) -> None:
        """Run the first requests untimed, with throw-away drafters: nothing reaches the measured pools."""
        limit = min(8, self.config.max_new_tokens)
        for ids in prompts:
            greedy_reference(self.loaded.model, ids, limit, self.loaded.stop_ids)
            for _, spec, budget in self.variants:
                drafter = self.new_drafter(spec) if is_drafter(spec) else None
                self.run(spec, budget, drafter, ids, "warmup", limit, self.new_policy(spec, budget))

    def serve(self, request, ids: list[int], grader: Grader) -> list[dict]:
        """One request under every method, back to back; its records (the reference's first)."""
        config, records = self.config, []
        # A sampled run has no token-for-token reference: its rows carry the distribution check.
        ref = (greedy_reference(self.loaded.model, ids, config.max_new_tokens, self.loaded.stop_ids)
               if config.audit and config.sampling.greedy else None)
        greedy = None
        if ref is not None:
            greedy = (REFERENCE, ref.output_ids)
            records.append(_record(REFERENCE, request, ids, dict(
                output_ids=ref.output_ids, forwards=len(ref.output_ids), wall_s=ref.wall_s), audit=None))
        for label, spec, budget in self.variants:
            res = self.run(spec, budget, self.drafters.get(label), ids, request.id, config.max_new_tokens,
                           self.policies.get(label), self.prefix_caches[label])
            if spec == "ar" and greedy is None:  # no audit: 'ar' (runs first) is greedy's output
                greedy = ("ar", res["output_ids"])
            audit = None
            if res.get("lossy") and greedy is not None:  # FLy: lossy by design; count what differs
                res["differs"] = dict(asdict(differences(res["output_ids"], greedy[1])), against=greedy[0])
            elif ref is not None:
                audit = asdict(compare(res["output_ids"], ref))
            if config.grade and gradable(request):
                res["correct"] = grader.grade(request, self.loaded.decode(res["output_ids"]))
            records.append(_record(label, request, ids, res, audit))
        return records


def _record(method: str, request, ids: list[int], res: dict, audit: dict | None) -> dict:
    out = res["output_ids"]
    return dict(res, method=method, request_id=request.id, category=request.category,
                prompt_len=len(ids), new_tokens=len(out),
                tau=len(out) / res["forwards"] if res["forwards"] else None, audit=audit)


class RecordSink:
    """Records as they come, written to records.jsonl at once, so a cut run keeps its data."""

    def __init__(self, out_dir: Path | None, config: BenchConfig) -> None:
        self.records: list[dict] = []
        self.file = None
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
            self.file = open(out_dir / "records.jsonl", "w")
            # The run's settings now, so `oilbird report` describes a run still in progress correctly.
            (out_dir / "config.json").write_text(json.dumps(asdict(config), indent=2) + "\n")

    def emit(self, record: dict) -> None:
        self.records.append(record)
        if self.file is not None:
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def run_bench(loaded: LoadedModel, config: BenchConfig, drafter_configs: dict | None = None,
              out_dir: Path | None = None, progress: bool = True,
              verifier_config: VerifierConfig | None = None,
              budget_config: BudgetConfig | None = None,
              forward_config: ForwardConfig | None = None) -> dict:
    """Run the benchmark and return the summary (also written to `out_dir` when given).

    Args:
        loaded: the target model.
        config: what to run.
        drafter_configs: method name -> config instance (default: each drafter's paper defaults).
        out_dir: where to write config.json, records.jsonl, summary.json and table.md (None: nowhere).
        progress: show a progress bar on stderr.
        verifier_config: what each forward exposes to drafters (default: VerifierConfig()).
        budget_config: candidate sizes and exploration of the 'auto' budget (default:
            BudgetConfig(mode="auto")).
        forward_config: the kernels the methods decode with (default: ForwardConfig(); its
            device and dtype are the loaded model's, set when it was loaded).

    Returns:
        The summary dict: per-method rows, the table, the strict methods whose audit failed
        (`audit_failed`) and the run's environment.

    Raises:
        DatasetError, PromptError, ConfigError: on bad input, before anything is decoded.
        KeyboardInterrupt: when stopped before the first request finished.
    """
    requests = config.requests()
    prompts = encode_requests(loaded, requests)
    harness = Harness(loaded, config, drafter_configs or {}, verifier_config or VerifierConfig(),
                      budget_config or BudgetConfig(mode="auto"), forward_config)
    harness.warm_up(prompts[: config.warmup])
    sink, grader = RecordSink(out_dir, config), Grader()
    bar = tqdm(list(zip(requests, prompts)), desc=f"bench {config.dataset}", unit="req",
               disable=not progress, file=sys.stderr)
    interrupted = False
    try:
        for request, ids in bar:
            for record in harness.serve(request, ids, grader):  # whole requests only
                sink.emit(record)
    except KeyboardInterrupt:  # Ctrl-C: keep and summarize the requests that finished
        interrupted = True
    bar.close()
    sink.close()
    if not sink.records:
        raise KeyboardInterrupt
    summary = _summary(harness, sink.records, interrupted)
    if out_dir is not None:
        (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        (out_dir / "table.md").write_text(summary["table"] + "\n")
    return summary


def _summary(harness: Harness, records: list[dict], interrupted: bool) -> dict:
    config, loaded, drafters = harness.config, harness.loaded, harness.drafters
    audited = config.audit and config.sampling.greedy  # a sampled run has no greedy reference row
    rows = summarize(records, [REFERENCE] * audited + [label for label, _, _ in harness.variants])
    for row in rows:  # pool/table memory at the end of the run
        row["memory_bytes"] = drafters[row["method"]].memory_bytes() if row["method"] in drafters else None
    curve = next(iter(harness.curves.values()), None)
    return dict(config=asdict(config), interrupted=interrupted,
                requests_served=len({r["request_id"] for r in records}),
                budget_curve=curve.to_json() if curve else None, budget=asdict(harness.budget_config),
                fit_calibration={label: p.calibration() for label, p in harness.policies.items()
                                 if isinstance(p, FittedTree)},
                drafters={m: d.describe() for m, d in drafters.items()},
                model=dict(name=loaded.name, source=loaded.source),
                environment=environment(loaded, harness.verifier.model), rows=rows,
                audit_failed=[r["method"] for r in audit_failures(rows)],
                table=format_table(rows, config))


def environment(loaded: LoadedModel, model=None) -> dict:
    """Where the numbers were measured (and with which kernels `model`, the verifier's, runs)."""
    import transformers

    return dict(machine=platform.machine(), processor=platform.processor() or platform.machine(),
                cpus=os.cpu_count(), python=platform.python_version(), torch=torch.__version__,
                transformers=transformers.__version__, device=str(loaded.device),
                dtype=str(loaded.dtype).removeprefix("torch."),
                kernels=describe_kernels(model if model is not None else loaded.model),
                threads=torch.get_num_threads(), time=time.strftime("%Y-%m-%d %H:%M:%S %Z"))
