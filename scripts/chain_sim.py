"""What a drafter gets in a chain-verifying engine (vLLM), replayed on our own engine in seconds.

vLLM verifies one draft chain per request and step. This script drives the very adapter vLLM's
proposer uses (`EngineDrafter`, oilbird/integrations/vllm/adapter.py) with our engine's verifier
in place of vLLM: each step the adapter proposes a chain, our `TreeVerifier` runs one greedy
forward over it, and the adapter observes what vLLM would hand it (committed tokens, the hidden
state after the final norm and the top-k at each verified position). Greedy decoding is
deterministic, so the counters (drafts, draft tokens, accepted) are the ones vLLM reports for the
same requests, up to the rare near-tie where vLLM's kernels and ours round differently; the
script checks every output against `--reference` (a `scripts/vllm_bench.py` method record, e.g.
its `none.json`) when given.

Time in vLLM is estimated from a per-step cost model fitted on a vllm_bench table:
    decode_s ~= steps * step_s + draft_tokens * draft_token_s + propose_s
where `propose_s` is the drafter's own time measured here (the same Python runs inside vLLM).
The defaults are this project's 2-core CPU at one thread (docs/VLLM.md).

Usage:
  .venv/bin/python scripts/chain_sim.py --methods oilbird,sam --workload slice \
      --reference out/vllm-bench-slice-seqs1-t1/none.json
  .venv/bin/python scripts/chain_sim.py --methods 'oilbird' --set node_budget=24 --set length_policy=fixed
  .venv/bin/python scripts/chain_sim.py --methods 'oilbird,oilbird[spine_live=false]' --workload stream --max-num-seqs 8

With `--max-num-seqs B` the requests run B at a time, as vLLM batches them: one adapter step per
engine step for the whole batch, each request's chain verified on its own cache. The counters are
exact again (greedy); the time estimate still models one request at a time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from oilbird.bench import encode_requests
from oilbird.datasets import load_dataset
from oilbird.errors import ConfigError
from oilbird.integrations.vllm.adapter import EngineDrafter, StepRequest
from oilbird.integrations.vllm.config import EngineDrafterConfig
from oilbird.methods import override
from oilbird.models import load_model
from oilbird.tree import DraftTree
from oilbird.verifier import TreeVerifier, VerifierConfig
from workloads import WORKLOADS, tenant_of  # the same workloads as the vLLM runs (scripts/ is on sys.path)



def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--methods", default="oilbird", help="comma list of method specs")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="an EngineDrafterConfig field for every method (repeatable)")
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="slice")
    p.add_argument("--limit", type=int, default=0)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--num-spec", type=int, default=8)
    p.add_argument("--model", default=None)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--max-num-seqs", type=int, default=1,
                   help="requests in flight at once, as vLLM's max_num_seqs (counters only: the "
                        "time estimate models one request at a time)")
    p.add_argument("--step-s", type=float, default=0.0233, help="cost of a step without drafts")
    p.add_argument("--draft-token-s", type=float, default=0.0018, help="extra cost per draft token")
    p.add_argument("--reference", default=None, help="a vllm_bench method JSON whose outputs must match")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    if args.max_num_seqs < 1:
        p.error(f"--max-num-seqs must be at least 1, got {args.max_num_seqs}")
    return args


def engine_config(method: str, settings: list[str]) -> EngineDrafterConfig:
    """The adapter's config: `method` with --set FIELD=VALUE overrides."""
    return override(EngineDrafterConfig(method=method), dict(item.partition("=")[::2] for item in settings), "--set")


def step_request(rid, prompt, tenant, drafts, ver, k, max_tokens, stop_ids) -> StepRequest:
    return StepRequest(request_id=rid, prompt_ids=prompt, tenant=tenant, drafts=drafts,
                       committed=list(ver.committed), hidden=ver.hidden.float(),
                       topk_ids=ver.topk_ids[:, :k], topk_logits=ver.topk_logits[:, :k].float(),
                       max_output=max_tokens, stop_ids=stop_ids)


def count_step(counts: dict, engine: EngineDrafter, rid: str, drafts: list[int], ver) -> None:
    """Add one verified chain to the counters, attributed to the sources of its first node."""
    counts["steps"] += 1
    counts["drafts"] += bool(drafts)
    counts["draft_tokens"] += len(drafts)
    counts["accepted"] += len(ver.path)
    if drafts:
        key = "+".join(sorted(engine.proposed[rid].sources[1])) or "?"
        by = counts["by_source"].setdefault(key, [0, 0, 0])
        by[0] += 1
        by[1] += len(drafts)
        by[2] += len(ver.path)


def serve(engine: EngineDrafter, verifier: TreeVerifier, rid: str, prompt: list[int], args,
          stop_ids: frozenset[int], counts: dict) -> list[int]:
    """One request through the adapter, as vLLM would serve it alone (max_num_seqs 1)."""
    state = verifier.prefill(prompt)
    k = engine.config.topk
    ver = verifier.verify(state, DraftTree.root(state.anchor), -1)  # the prefill's sampled token
    drafts: list[int] = []
    out: list[int] = []
    while True:
        request = step_request(rid, prompt, tenant_of(args.workload), drafts, ver, k, args.max_tokens, stop_ids)
        t = time.perf_counter()
        drafts = engine.step([request], args.num_spec)[0]
        counts["propose_s"] += time.perf_counter() - t
        kept = ver.committed[:args.max_tokens - len(out)]
        out.extend(kept)
        if len(out) >= args.max_tokens or ver.finished:
            break
        ver = verifier.verify(state, DraftTree.chain(state.anchor, drafts, "engine"), -1)
        count_step(counts, engine, rid, drafts, ver)
    for key, value in engine.drafter.request_stats(rid).items():  # e.g. Oilbird's retrieval time
        if isinstance(value, (int, float)) and not isinstance(value, bool) and key not in ("theta", "bytes_per_record", "store_records"):
            counts["drafter"][key] = counts["drafter"].get(key, 0) + value
    engine.finish(rid)
    return out


class InFlight:
    """One request of a batch: its KV state, last verification, drafts and output so far."""

    def __init__(self, rid: str, index: int, prompt: list[int], verifier: TreeVerifier):
        self.rid, self.index, self.prompt = rid, index, prompt
        self.state = verifier.prefill(prompt)
        self.ver = verifier.verify(self.state, DraftTree.root(self.state.anchor), -1)  # the prefill's token
        self.drafts: list[int] = []
        self.out: list[int] = []


def serve_batched(engine: EngineDrafter, verifier: TreeVerifier, prompts: list[list[int]], args,
                  stop_ids: frozenset[int], counts: dict) -> list[list[int]]:
    """All requests through the adapter, `args.max_num_seqs` in flight at once, as vLLM batches
    them: one adapter step per engine step for the whole batch (so the batch raises the reach a
    draft needs), then each request's chain verified on its own cache (greedy: the same outcome
    as in one batched forward). A request that finishes leaves, the next one in line enters."""
    k, queue, active = engine.config.topk, list(enumerate(prompts)), []
    outputs: list[list[int]] = [[] for _ in prompts]
    while queue or active:
        while queue and len(active) < args.max_num_seqs:
            index, prompt = queue.pop(0)
            active.append(InFlight(f"r{index}", index, prompt, verifier))
        batch = [step_request(r.rid, r.prompt, tenant_of(args.workload), r.drafts, r.ver, k, args.max_tokens, stop_ids)
                 for r in active]
        t = time.perf_counter()
        proposals = engine.step(batch, args.num_spec)
        counts["propose_s"] += time.perf_counter() - t
        for r, drafts in zip(list(active), proposals):
            r.out.extend(r.ver.committed[:args.max_tokens - len(r.out)])
            if len(r.out) >= args.max_tokens or r.ver.finished:
                outputs[r.index] = r.out
                engine.finish(r.rid)
                active.remove(r)
                continue
            r.drafts, r.ver = drafts, verifier.verify(r.state, DraftTree.chain(r.state.anchor, drafts, "engine"), -1)
            count_step(counts, engine, r.rid, drafts, r.ver)
    return outputs


def empty_counts() -> dict:
    """The counters `serve` adds to: steps, drafts, draft tokens, accepted, time, attribution."""
    return dict(steps=0, drafts=0, draft_tokens=0, accepted=0, propose_s=0.0, by_source={}, drafter={})


def run(method: str, args, loaded, verifier, prompts, reference) -> dict:
    engine = EngineDrafter.build(engine_config(method, args.set))
    counts = empty_counts()
    if args.max_num_seqs > 1:
        outputs = serve_batched(engine, verifier, prompts, args, loaded.stop_ids, counts)
    else:
        outputs = [serve(engine, verifier, f"r{i}", prompt, args, loaded.stop_ids, counts)
                   for i, prompt in enumerate(tqdm(prompts, desc=method, file=sys.stderr, leave=False))]
    differing = [i for i, out in enumerate(outputs) if reference is not None and out != reference[i]]
    tokens = sum(len(o) for o in outputs)
    est = counts["steps"] * args.step_s + counts["draft_tokens"] * args.draft_token_s + counts["propose_s"]
    return dict(method=method, settings=args.set, tokens=tokens, **counts,
                tau=tokens / max(1, counts["steps"] + len(prompts)),
                mean_acc_len=1 + counts["accepted"] / max(1, counts["drafts"]),
                est_decode_s=est, differing=differing)


def load(args: argparse.Namespace):
    """The model, its verifier and the workload's prompts (token ids), as `args` name them."""
    torch.set_num_threads(args.threads)
    work = WORKLOADS[args.workload]
    requests = load_dataset(work.dataset, per_category=work.per_category, limit=work.limit)
    if args.limit:
        requests = requests[:args.limit]
    loaded = load_model(args.model) if args.model else load_model()
    prompts = encode_requests(loaded, requests)
    return loaded, TreeVerifier(loaded.model, loaded.stop_ids, VerifierConfig(top_k=10)), prompts


def main(argv=None) -> int:
    args = parse_args(argv)
    try:  # a bad method or --set fails now, not after the model has loaded
        for method in args.methods.split(","):
            EngineDrafter.build(engine_config(method, args.set))
    except ConfigError as e:
        raise SystemExit(f"chain_sim: {e}") from None
    loaded, verifier, prompts = load(args)
    reference = None
    if args.reference:
        reference = [o["output_ids"] for o in json.loads(Path(args.reference).read_text())["outputs"]]
    rows = [run(m, args, loaded, verifier, prompts, reference) for m in args.methods.split(",")]
    print("| method | steps | drafts | draft tok | accepted | tau | mean acc len | propose ms/step "
          "| est. decode s | differing |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['method']} | {r['steps']} | {r['drafts']} | {r['draft_tokens']} | {r['accepted']} "
              f"| {r['tau']:.2f} | {r['mean_acc_len']:.2f} | {1e3 * r['propose_s'] / max(1, r['steps']):.2f} "
              f"| {r['est_decode_s']:.1f} | {len(r['differing'])} |")
    for r in rows:
        print(r["method"], {k: f"{v[0]} steps {v[1]} tok {v[2]} acc" for k, v in r["by_source"].items()})
        if r["drafter"]:
            print(r["method"], "drafter:", {k: round(v, 3) for k, v in r["drafter"].items()})
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
