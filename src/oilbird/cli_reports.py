"""`oilbird` subcommands that load no model: `report`, `table` and `list` read saved runs and
listings; `replay` drives a running server (`oilbird serve`, or any OpenAI-compatible one).

`oilbird.cli` registers their parsers (`add_report_parsers`, `add_replay_parser`) beside its own.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from oilbird.errors import ConfigError


def cmd_report(args: argparse.Namespace) -> int:
    from oilbird.tables import report

    if args.first is not None and args.first < 1:
        raise ConfigError(f"--first must be a positive integer, got {args.first}")
    print(report(Path(args.run_dir), by_category=args.by_category, first=args.first,
                 method=args.method, under_test=args.under_test))
    return 0


def cmd_table(args: argparse.Namespace) -> int:
    from oilbird.results import (comparison_table, load_run, merge_runs, plot_comparison, semantic_report,
                                 source_shares)

    runs = merge_runs([load_run(Path(d)) for d in args.run_dirs])
    print(comparison_table(runs))
    shares = source_shares(runs)
    if shares:
        print("\nAccepted draft tokens by source (multi-source methods):\n" + shares)
    if args.semantic:
        print("\nThe semantic source (pairs, ablations, costs):\n\n" + semantic_report(runs))
    if args.plot:
        plot_comparison(runs, Path(args.plot))
        print(f"\nplot: {args.plot}")
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from oilbird.replay import ReplayOptions, run_replay

    options = ReplayOptions(url=args.url, dataset=args.dataset, concurrency=args.concurrency,
                            api_key=args.api_key, limit=args.limit, max_tokens=args.max_tokens,
                            model=args.model, temperature=args.temperature, seed=args.seed,
                            stream=args.stream, data_dir=args.data_dir)
    record = run_replay(options, out_dir=Path(args.out) if args.out else None, progress=not args.no_progress)
    print(f"replay of {args.dataset} against {record['url']} (model {record['model']}, "
          f"concurrency {args.concurrency}{', streamed' if args.stream else ''})\n")
    print(record["table"])
    if args.out:
        print(f"\nrecord: {Path(args.out) / 'replay.json'}")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from oilbird.datasets import DATASET_NAMES
    from oilbird.drafters import DRAFTERS
    from oilbird.models import PRESETS

    print("models:  " + ", ".join(PRESETS) + " (or a .gguf file, a transformers directory, a hub id)")
    print("datasets: " + ", ".join(DATASET_NAMES) + " (or spec-bench:<category>, or a .jsonl file)")
    print("methods: " + ", ".join(sorted(DRAFTERS)) + ", hf-pld")
    print("  append +fly to a drafter (e.g. draft+fly, pld+fly) to verify with FLy's loose rule: LOSSY, opt-in")
    return 0


def add_replay_parser(sub) -> None:
    rep = sub.add_parser("replay", help="replay a dataset against an OpenAI-compatible server and measure it")
    rep.add_argument("--url", required=True, help="the server, e.g. http://localhost:8000 (/v1 is added)")
    rep.add_argument("--dataset", required=True,
                     help="api-bank[/<file>], spec-bench[:<category>,...], humaneval, or a .jsonl file")
    rep.add_argument("--concurrency", type=int, default=1, help="requests in flight at once (default: 1)")
    rep.add_argument("--api-key", default=None, help="the server's API key (default: none)")
    rep.add_argument("--limit", type=int, default=None, help="only the first N requests (default: all)")
    rep.add_argument("--max-tokens", type=int, default=64, help="most tokens per answer (default: 64)")
    rep.add_argument("--model", default=None, help="the served model (default: the first the server lists)")
    rep.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default: 0, greedy)")
    rep.add_argument("--seed", type=int, default=None, help="sampling seed sent with each request")
    rep.add_argument("--stream", action="store_true", help="stream the answers and measure time to first token")
    rep.add_argument("--out", default=None, help="write per-request records and the summary to DIR/replay.json")
    rep.add_argument("--data-dir", default=None, help="folder holding the shared datasets (default: find it)")
    rep.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    rep.set_defaults(func=cmd_replay)


def add_report_parsers(sub) -> None:
    """`report`, `table` and `list`: commands that read saved runs or listings and load no model."""
    rep = sub.add_parser("report", help="re-make a benchmark's tables from its records.jsonl")
    rep.add_argument("run_dir", help="the --out directory of an `oilbird bench` run")
    rep.add_argument("--by-category", action="store_true", help="one table per request category")
    rep.add_argument("--first", type=int, default=None, help="only the first N requests served")
    rep.add_argument("--method", default=None, help="with --by-category: one compact table for this method")
    rep.add_argument("--under-test", default=None,
                     help="set this method's tokens/s against every other's, with paired intervals (default: "
                          "the run's last method)")
    rep.set_defaults(func=cmd_report)

    tab = sub.add_parser("table", help="one comparison table (and plot) across benchmark runs")
    tab.add_argument("run_dirs", nargs="+", help="--out directories of `oilbird bench` runs")
    tab.add_argument("--plot", default=None, help="also draw τ and speedup to this PNG file")
    tab.add_argument("--semantic", action="store_true",
                     help="also the semantic source's tables: with/without pairs, ablations, retrieval cost")
    tab.set_defaults(func=cmd_table)

    lst = sub.add_parser("list", help="list model presets, datasets and methods")
    lst.set_defaults(func=cmd_list)
