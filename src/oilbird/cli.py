"""The `oilbird` command: `bench`, `generate`, `diagnose`, `cost`, `report`, `table`, and listings
of models, datasets and methods.

Options for each component are derived from its config dataclass (see `oilbird.config`), so a
new config field appears on the command line with its docstring as help. User mistakes raise
`OilbirdError`; `main` prints its message and exits with status 2, without a traceback.
`bench` exits with status 3 (after writing all its outputs) when a strict method's output
differs from greedy decoding, so scripts and CI can gate on losslessness.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path

from oilbird.config import add_config_args, config_from_args
from oilbird.errors import ConfigError, OilbirdError
from oilbird.cli_reports import add_report_parsers, add_replay_parser
from oilbird.serve import add_serve_parser

AUDIT_FAILED = 3
"""Exit status of `oilbird bench` when a strict (lossless) method's output differs from greedy decoding."""


def _log(message: str) -> None:
    print(f"oilbird: {message}", file=sys.stderr, flush=True)


def _drafter_configs(args: argparse.Namespace) -> dict:
    from oilbird.drafters import DRAFTERS

    return {name: config_from_args(cls.Config, args, prefix=name)
            for name, cls in DRAFTERS.items() if hasattr(cls.Config, "__dataclass_fields__")}


def _add_drafter_args(parser: argparse.ArgumentParser) -> None:
    from oilbird.drafters import DRAFTERS

    for name, cls in sorted(DRAFTERS.items()):
        if hasattr(cls.Config, "__dataclass_fields__"):
            add_config_args(parser, cls.Config, prefix=name)


def _set_threads(args: argparse.Namespace) -> None:
    import torch

    if args.threads is not None:
        if args.threads < 1:
            raise ConfigError(f"--threads must be a positive integer, got {args.threads}")
        torch.set_num_threads(args.threads)


def _add_threads_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for torch (default: torch's choice, usually all cores)")


def _forward_config(args: argparse.Namespace):
    from oilbird.kernels import ForwardConfig

    return config_from_args(ForwardConfig, args, prefix="")


def _load(args: argparse.Namespace):
    """The model of `--model`, on `--device` in `--dtype`."""
    from oilbird.models import load_model

    forward = _forward_config(args)
    return load_model(args.model, device=forward.device, dtype=forward.torch_dtype, log=_log)


def cmd_bench(args: argparse.Namespace) -> int:
    from oilbird.bench import BenchConfig, run_bench
    from oilbird.budget import BudgetConfig
    from oilbird.sampling import SamplingConfig
    from oilbird.verifier import VerifierConfig

    config = config_from_args(BenchConfig, args, prefix="",
                              sampling=config_from_args(SamplingConfig, args, prefix=""))
    _set_threads(args)
    config.method_list()  # unknown methods fail before the model loads
    drafter_configs = _drafter_configs(args)
    forward = _forward_config(args)
    verifier_config = config_from_args(VerifierConfig, args, prefix="verifier")  # bad values fail before the load
    budget_config = config_from_args(BudgetConfig, args, prefix="budget", mode="auto")
    loaded = _load(args)
    out_dir = Path(args.out)
    summary = run_bench(loaded, config, drafter_configs, out_dir=out_dir, progress=not args.no_progress,
                        verifier_config=verifier_config, budget_config=budget_config, forward_config=forward)
    print(summary["table"])
    if summary["budget_curve"]:
        from oilbird.cost_curve import CostCurve

        curve = CostCurve.from_json(summary["budget_curve"])
        print(f"\nThe cost curve the measured budgets ('auto', 'fit') used ({curve.key}):\n\n{curve.table()}")
    if summary["interrupted"]:
        print(f"\ninterrupted: summarized the {summary['requests_served']} requests that every method finished")
    print(f"\nrecords: {out_dir / 'records.jsonl'}  summary: {out_dir / 'summary.json'}")
    failed = [r for r in summary["rows"] if r["method"] in summary["audit_failed"]]
    for row in failed:
        for d in row["divergences"]:
            print(f"DIVERGENCE {row['method']} {d['request_id']}: token {d['divergence']} "
                  f"expected {d['expected']} got {d['got']} (reference margin {d['margin']})")
    if failed:  # after every output is written: a script or CI gates on the status
        diverged = sum(r["audited"] - r["lossless"] for r in failed)
        _log(f"audit failed: {diverged} request(s) of {', '.join(r['method'] for r in failed)} differ "
             f"from greedy decoding (see the DIVERGENCE lines; records in {out_dir})")
        return AUDIT_FAILED
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from oilbird.decode import DecodeConfig, decode
    from oilbird.drafters import make_drafter
    from oilbird.fly import FlyConfig
    from oilbird.sampling import SamplingConfig
    from oilbird.verifier import TreeVerifier, VerifierConfig

    decode_config = config_from_args(DecodeConfig, args, prefix="",
                                     sampling=config_from_args(SamplingConfig, args, prefix=""))
    fly = config_from_args(FlyConfig, args, prefix="fly") if args.fly else None
    if fly is not None and not decode_config.sampling.greedy:
        raise ConfigError("--fly verifies greedily only; drop --fly or sample at --temperature 0")
    if not args.fly and any(getattr(args, f"fly__{f}", None) is not None for f in FlyConfig.__dataclass_fields__):
        raise ConfigError("--fly-* options set FLy's rule; add --fly to use it")
    _set_threads(args)
    drafter = make_drafter(args.method, _drafter_configs(args).get(args.method))
    forward = _forward_config(args)
    loaded = _load(args)
    drafter.attach(loaded)
    if args.raw:
        ids = loaded.encode_text(args.prompt)
    else:
        ids = loaded.encode_chat([{"role": "user", "content": args.prompt}])
    verifier = TreeVerifier(loaded.tree_model(forward), loaded.stop_ids,
                            config_from_args(VerifierConfig, args, prefix="verifier"), fly=fly)
    result = decode(verifier, drafter, ids, decode_config, max_context=loaded.max_context)
    print(loaded.decode(result.output_ids))
    stats = dict(method=args.method, prompt_tokens=len(ids), new_tokens=len(result.output_ids),
                 forwards=result.forwards, tau=round(result.tau, 3),
                 tokens_per_s=round(len(result.output_ids) / result.wall_s, 2),
                 finish_reason=result.finish_reason,
                 **(dict(lossy=True, forgiven=len(result.forgiven_positions)) if result.lossy else {}),
                 seconds=dict(prefill=round(result.prefill_s, 3), drafter=round(result.drafter_s, 3),
                              forward=round(result.forward_s, 3),
                              bookkeeping=round(result.bookkeeping_s, 3), wall=round(result.wall_s, 3)))
    print(json.dumps(stats) if args.json else
          " ".join(f"{k}={v}" for k, v in stats.items() if k != "seconds")
          + " | " + " ".join(f"{k}={v}s" for k, v in stats["seconds"].items()), file=sys.stderr)
    return 0


def cmd_diagnose(args: argparse.Namespace) -> int:
    from oilbird.gap_measures import DiagnosisConfig
    from oilbird.gap_replay import ReplayConfig, run_diagnosis
    from oilbird.gap_report import plot_diagnosis

    replay_config = config_from_args(ReplayConfig, args, prefix="")
    config = config_from_args(DiagnosisConfig, args, prefix="diagnosis")
    requests = replay_config.requests()  # a bad dataset (or comparison run) fails before the model loads
    if args.compare_run:
        from oilbird.gap_report import bench_records

        bench_records(Path(args.compare_run), args.compare_method, [r.id for r in requests])
    _set_threads(args)
    loaded = _load(args)
    summary = run_diagnosis(loaded, replay_config, config, out_dir=Path(args.out),
                            progress=not args.no_progress, requests=requests)
    print(summary["table"])
    if args.compare_run:
        from oilbird.gap_report import format_gap_vs_share, gap_vs_share

        summary["gap_vs_share"] = gap_vs_share(summary, Path(args.compare_run), args.compare_method)
        print("\n" + format_gap_vs_share(summary["gap_vs_share"]))
        (Path(args.out) / "summary.json").write_text(json.dumps(summary, indent=1))
    if args.plot:
        plot_diagnosis(summary, Path(args.plot))
        print(f"\nplot: {args.plot}")
    print(f"\npositions: {Path(args.out) / 'positions.jsonl'}  summary: {Path(args.out) / 'summary.json'}")
    return 0


def cmd_cost(args: argparse.Namespace) -> int:
    from oilbird.budget import BudgetConfig
    from oilbird.cost_curve import load_or_measure
    from oilbird.models import default_cache_dir
    from oilbird.verifier import TreeVerifier, VerifierConfig

    config = config_from_args(BudgetConfig, args, prefix="budget", mode="auto")
    verifier_config = config_from_args(VerifierConfig, args, prefix="verifier")
    _set_threads(args)
    forward = _forward_config(args)
    loaded = _load(args)
    verifier = TreeVerifier(loaded.tree_model(forward), loaded.stop_ids, verifier_config)
    curve = load_or_measure(loaded, verifier, config, default_cache_dir(), log=_log)
    # The one-node row is the autoregressive step, exactly as decoding runs it.
    print(f"verification cost on {loaded.device} ({curve.key})")
    print(curve.table(config.sizes()))
    return 0


def _add_model_arg(parser: argparse.ArgumentParser) -> None:
    """--model, and where and how it runs: --device, --dtype, --gemm, --attention (ForwardConfig)."""
    from oilbird.kernels import ForwardConfig
    from oilbird.models import DEFAULT_MODEL

    parser.add_argument("--model", default=DEFAULT_MODEL, help="preset, .gguf file, directory or hub id")
    add_config_args(parser, ForwardConfig)


def _bench_parser(sub) -> None:
    from oilbird.bench import BenchConfig
    from oilbird.budget import BudgetConfig
    from oilbird.sampling import SamplingConfig
    from oilbird.verifier import VerifierConfig

    bench = sub.add_parser("bench", help="run methods side by side on a dataset and audit them")
    _add_model_arg(bench)
    bench.add_argument("--out", default="bench-out", help="directory for records.jsonl and summary.json")
    bench.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    _add_threads_arg(bench)
    add_config_args(bench, BenchConfig)
    add_config_args(bench, SamplingConfig)
    add_config_args(bench, VerifierConfig, prefix="verifier")
    add_config_args(bench, BudgetConfig, prefix="budget", exclude=("mode",))  # for --budget auto
    _add_drafter_args(bench)
    bench.set_defaults(func=cmd_bench)


def _diagnose_parser(sub) -> None:
    from oilbird.gap_measures import DiagnosisConfig
    from oilbird.gap_replay import ReplayConfig

    diag = sub.add_parser("diagnose", help="the identifiability-gap diagnosis of a dataset (no drafter)")
    _add_model_arg(diag)
    diag.add_argument("--out", default="diagnose-out", help="directory for positions.jsonl and summary.json")
    diag.add_argument("--plot", default=None, help="also draw the per-category breakdown to this PNG file")
    diag.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    diag.add_argument("--compare-run", default=None,
                      help="an `oilbird bench --out` directory over the same requests: print each category's gap "
                           "beside the semantic source's measured sole-source share there")
    diag.add_argument("--compare-method", default="oilbird", help="the bench row with the semantic source")
    _add_threads_arg(diag)
    add_config_args(diag, ReplayConfig)
    add_config_args(diag, DiagnosisConfig, prefix="diagnosis")
    diag.set_defaults(func=cmd_diagnose)


def _generate_parser(sub) -> None:
    from oilbird.decode import DecodeConfig
    from oilbird.fly import FlyConfig
    from oilbird.sampling import SamplingConfig
    from oilbird.verifier import VerifierConfig

    gen = sub.add_parser("generate", help="generate for one prompt and print the text and its stats")
    gen.add_argument("--prompt", required=True, help="the user message (or raw text with --raw)")
    gen.add_argument("--method", default="pld", help="drafting method (see `oilbird list`)")
    _add_model_arg(gen)
    gen.add_argument("--raw", action="store_true", help="use the prompt as raw text, without the chat template")
    gen.add_argument("--json", action="store_true", help="print the stats as JSON")
    _add_threads_arg(gen)
    add_config_args(gen, DecodeConfig)
    add_config_args(gen, SamplingConfig)
    add_config_args(gen, VerifierConfig, prefix="verifier")
    gen.add_argument("--fly", action="store_true",
                     help="verify with FLy's loose rule (LOSSY: the output may differ from greedy decoding)")
    add_config_args(gen, FlyConfig, prefix="fly")
    _add_drafter_args(gen)
    gen.set_defaults(func=cmd_generate)


def _cost_parser(sub) -> None:
    from oilbird.budget import BudgetConfig
    from oilbird.verifier import VerifierConfig

    cost = sub.add_parser("cost", help="measure (once, then cached) verification time against tree size")
    _add_model_arg(cost)
    _add_threads_arg(cost)
    # The curve is the same whatever the mode; only the measurement's fields are options here.
    add_config_args(cost, BudgetConfig, prefix="budget",
                    exclude=("mode", "explore_every", "explore_share", "decay", "fit_context", "fit_objective",
                             "fit_explore_every", "fit_explore_nodes"))
    add_config_args(cost, VerifierConfig, prefix="verifier")  # the options decoding runs with
    cost.set_defaults(func=cmd_cost)


def build_parser() -> argparse.ArgumentParser:
    """The `oilbird` parser: one subcommand per job, options derived from the config dataclasses."""
    parser = argparse.ArgumentParser(prog="oilbird", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_bench_parser, _diagnose_parser, _generate_parser, _cost_parser, add_report_parsers,
                add_serve_parser, add_replay_parser):
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `oilbird` console script; returns the exit status."""
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if getattr(args, "passthrough", False):
        args.rest = rest  # `serve` hands options it does not know to vLLM's parser
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    # `timeout` and `kill` stop a run as Ctrl-C does: `bench` keeps and summarizes what finished.
    # (Background jobs of a non-interactive shell ignore SIGINT, so SIGTERM is their only clean stop.)
    # Only the main thread may set handlers (main() called from a worker thread leaves SIGTERM alone).
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminate) if in_main else None
    try:
        return args.func(args)
    except OilbirdError as err:
        print(f"oilbird: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("oilbird: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into `head` and closed: not an error
        sys.stderr.close()
        return 0
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)


def _terminate(signum, frame) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
