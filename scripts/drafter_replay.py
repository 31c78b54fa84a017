"""A drafter's own time per engine step, on recorded traffic, without the model.

`--record FILE` serves the workload through the vLLM adapter with our verifier in place of vLLM
(exactly as `scripts/chain_sim.py` does) and saves every step the adapter saw: the request's ids,
the drafts verified, the tokens committed, the hidden states and top-k, and the chain it proposed.
`--replay FILE` feeds those steps to a fresh adapter of the same method, with no model loaded,
checks that it proposes the recorded chain at every step (a drafter change that alters a single
draft fails here, with the step named), and prints the adapter's time per step, the best of
`--repeats` passes. It measures what the drafter costs inside vLLM (the same Python runs there,
once per request per step) in seconds, so that changes to the drafters' speed can be timed
alone, and checked to change nothing they propose. It also prints, per request, the time of its
first step (start_request, the prefill's observation, the first proposal) and of its finish (the
request joins its pools): inside vLLM both fall in a request's time to first token.

Usage:
  .venv/bin/python scripts/drafter_replay.py --record /tmp/slice-oilbird.pt --methods oilbird
  .venv/bin/python scripts/drafter_replay.py --replay /tmp/slice-oilbird.pt --repeats 5
  .venv/bin/python scripts/drafter_replay.py --replay /tmp/slice-oilbird.pt --profile 25
"""

from __future__ import annotations

import argparse
import pickle
import cProfile
import pstats
import sys
import time

import torch

import chain_sim  # scripts/ is on sys.path
from oilbird.integrations.vllm.adapter import EngineDrafter


class Recorder:
    """An adapter's stand-in that forwards every call and keeps the steps and finishes it saw."""

    def __init__(self, engine: EngineDrafter):
        self.engine, self.events = engine, []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def step(self, batch, max_drafts):
        drafts = self.engine.step(batch, max_drafts)
        self.events.append(("step", batch, max_drafts, drafts))
        return drafts

    def finish(self, request_id):
        self.events.append(("finish", request_id))
        return self.engine.finish(request_id)


def record(args) -> None:
    """Serve the workload once per method through a Recorder and save its events."""
    sim = chain_sim.parse_args(["--workload", args.workload, "--limit", str(args.limit),
                                "--threads", str(args.threads)] + sum((["--set", s] for s in args.set), []))
    loaded, verifier, prompts = chain_sim.load(sim)
    saved = {}
    for method in args.methods.split(","):
        engine = Recorder(EngineDrafter.build(chain_sim.engine_config(method, args.set)))
        counts = chain_sim.empty_counts()
        for i, prompt in enumerate(prompts):
            chain_sim.serve(engine, verifier, f"r{i}", prompt, sim, loaded.stop_ids, counts)
        saved[method] = dict(settings=args.set, events=engine.events)
        print(f"{method}: {counts['steps']} steps, {counts['draft_tokens']} draft tokens, "
              f"{counts['accepted']} accepted, recorded")
    torch.save(saved, args.record)


def replay_once(method: str, settings: list[str], events: list) -> dict[str, float]:
    """One pass of `events` through a fresh adapter: the seconds spent, by kind of event.

    Returns:
        {"first": steps that start a request (its prefill's first token, start_request, the first
        proposal), "later": the other steps, "finish": the finishes (a request joins its pools)}.
        Inside vLLM the first two kinds of the next request and the finish of the last one all
        fall in the next request's prefill (time to first token).

    Raises:
        SystemExit: the adapter proposed something other than what was recorded.
    """
    engine = EngineDrafter.build(chain_sim.engine_config(method, settings))
    spent = {"first": 0.0, "later": 0.0, "finish": 0.0}
    for n, event in enumerate(events):
        if event[0] == "finish":
            t = time.perf_counter()
            engine.finish(event[1])
            spent["finish"] += time.perf_counter() - t
            continue
        _, batch, max_drafts, recorded = event
        kind = "later" if all(r.request_id in engine.drafter.requests for r in batch) else "first"
        t = time.perf_counter()
        drafts = engine.step(batch, max_drafts)
        spent[kind] += time.perf_counter() - t
        if drafts != recorded:
            raise SystemExit(f"{method}: event {n} ({batch[0].request_id}) proposed {drafts}, "
                             f"recorded {recorded}")
    return spent


def replay(args) -> None:
    try:
        saved = torch.load(args.replay, weights_only=False)  # our own recording: trusted pickles
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError) as e:
        raise SystemExit(f"drafter_replay: cannot read {args.replay!r} ({e}); make it with --record") from None
    if not isinstance(saved, dict) or not all("events" in entry for entry in saved.values()):
        raise SystemExit(f"drafter_replay: {args.replay!r} is not a --record file")
    torch.set_num_threads(args.threads)
    for method, entry in saved.items():
        steps = sum(e[0] == "step" for e in entry["events"])
        if args.profile:
            profiler = cProfile.Profile()
            profiler.runcall(replay_once, method, entry["settings"], entry["events"])
            pstats.Stats(profiler).sort_stats("tottime").print_stats(args.profile)
        passes = [replay_once(method, entry["settings"], entry["events"]) for _ in range(args.repeats)]
        best = min(passes, key=lambda spent: sum(spent.values()))
        requests = max(1, sum(e[0] == "finish" for e in entry["events"]))
        print(f"| {method} | {steps} | {1e3 * sum(best.values()) / steps:.3f} | "
              f"{1e3 * best['first'] / requests:.2f} | {1e3 * best['finish'] / requests:.2f} | identical |")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--record", help="serve the workload and save its steps here")
    p.add_argument("--replay", help="replay the steps saved here and time the adapter")
    p.add_argument("--methods", default="oilbird", help="comma list of method specs (--record)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="an EngineDrafterConfig field for every method (repeatable)")
    p.add_argument("--workload", default="slice", choices=sorted(chain_sim.WORKLOADS))
    p.add_argument("--limit", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--profile", type=int, default=0, metavar="ROWS",
                   help="also profile one pass and print this many functions by own time")
    args = p.parse_args(argv)
    if bool(args.record) == bool(args.replay):
        p.error("give exactly one of --record FILE and --replay FILE")
    if args.record:
        record(args)
    else:
        print("| method | steps | adapter ms per step | first step ms per request | finish ms per request "
              "| proposals |\n|---|---:|---:|---:|---:|---|")
        replay(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
