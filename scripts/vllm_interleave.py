"""Methods inside vLLM compared chunk by chunk, interleaved, so that the host's drift cancels.

`scripts/vllm_bench.py` times each method over the whole workload, one after the other. On a
shared 2-core host whose speed drifts by 10-20% within minutes, the order of the rows then moves
the ratios as much as the methods do (docs/VLLM.md: one order read Oilbird at 1.16x `suffix`, the
other at 0.93x). Here every method is a long-lived vLLM engine of its own (a child process of
this script, built and warmed up once), and the workload is served in chunks of `--chunk`
consecutive requests: chunk k goes to every method in turn, the order rotated by one each chunk,
so every method meets the same minutes of the host, first and last equally often. Each engine
serves the same requests in the same order, so its pools (vLLM's prefix cache, our drafters'
tenant pool) grow as in one long run; at max_num_seqs > 1 batches form within a chunk only.

Reported per method (pooled over chunks, as `vllm_bench.py`'s table): tokens/s, speedup over
`none`, acceptance and counters, identical outputs. Then, against `--reference` (default
`suffix` when it runs, else `none`): the pooled ratio of tokens/s, the geometric mean of the
chunks' ratios, and a 90% bootstrap interval of the pooled ratio over chunks (resampled, 2000
draws, seed 0), which says how much of a difference the chunks support.

Every option of `scripts/vllm_bench.py` applies (workload, max_num_seqs, threads, methods, --set,
...), but --isolation and --resume. Output: the tables on stdout; under --out DIR
`<method>.json` (pooled record, per-chunk records, outputs), `summary.json`, `table.md`.

Usage:
  VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python scripts/vllm_interleave.py --workload stream \\
      --max-num-seqs 1 --threads 1 --methods none,suffix,oilbird --chunk 10 --out /tmp/il-seqs1
  .venv-vllm/bin/python scripts/vllm_interleave.py --limit 4 --chunk 2 --methods none,sam  # smoke
  python scripts/vllm_interleave.py --combine /tmp/il-a /tmp/il-b   # earlier runs' chunks pooled
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path

import vllm_bench as vb
import vllm_records
from workloads import WORKLOADS

POLL_S = 0.05  # how often the parent looks for a child's result file


def parse_args(argv=None):
    """(this script's options, vllm_bench's parsed arguments)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--chunk", type=int, default=10, help="requests per chunk (default 10)")
    p.add_argument("--reference", default=None,
                   help="the method the others are compared with chunk by chunk "
                        "(default: suffix if it runs, else none)")
    p.add_argument("--combine", nargs="+", default=None, metavar="DIR",
                   help="run nothing: pool the chunks of earlier runs (their --out directories, same "
                        "workload and settings) and print the chunk-by-chunk comparison over all of them")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # child: its method
    p.add_argument("--io", default=None, help=argparse.SUPPRESS)  # child: its exchange directory
    ours, rest = p.parse_known_args(argv)
    if ours.chunk < 1:
        p.error(f"--chunk must be >= 1, got {ours.chunk}")
    args = vb.parse_args(rest)
    if args.isolation != "inproc" or args.resume:
        p.error("--isolation and --resume are vllm_bench.py's; here every method is its own process")
    if ours.reference is None:
        ours.reference = "suffix" if "suffix" in args.method_list else "none"
    if ours.reference not in args.method_list:
        p.error(f"--reference {ours.reference} is not among the methods {args.method_list}")
    return ours, args


def atomic_write(path: Path, data: dict) -> None:
    """Write JSON so that a reader polling for `path` never sees half of it."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def child(method: str, io: Path, args) -> int:
    """One method's engine: build it, then serve chunk commands ('A B' on stdin) until EOF."""
    data = json.loads((io / "workload.json").read_text())
    reqs = data["reqs"]
    record = dict(method=method, engine_kwargs=vb.engine_kwargs(method, args))
    try:
        llm = vb.build_llm(method, data["source"], reqs, data["warm"], args, record)
    except Exception as error:  # noqa: BLE001 -- reported to the parent, which stops
        atomic_write(io / f"{method}.ready", dict(record, ok=False, error=f"{type(error).__name__}: {error}",
                                                  traceback=traceback.format_exc()))
        return 1
    atomic_write(io / f"{method}.ready", dict(record, ok=True))
    try:
        for line in sys.stdin:
            a, b = (int(x) for x in line.split())
            try:
                result = dict(vb.timed_generate(llm, reqs[a:b], args, use_tqdm=False), ok=True)
            except Exception as error:  # noqa: BLE001
                result = dict(ok=False, error=f"{type(error).__name__}: {error}",
                              traceback=traceback.format_exc())
            atomic_write(io / f"{method}.{a}.json", result)
    finally:
        vb.shutdown(llm)
    return 0


class Engine:
    """The parent's handle on one child engine."""

    def __init__(self, method: str, io: Path, argv: list[str]):
        self.method, self.io = method, io
        cmd = [sys.executable, os.path.abspath(__file__), *argv, "--worker", method, "--io", str(io)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, text=True)

    def wait_file(self, name: str) -> dict:
        path = self.io / name
        while not path.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.method}: engine process exited {self.proc.returncode}")
            time.sleep(POLL_S)
        data = json.loads(path.read_text())
        path.unlink()
        return data

    def run(self, a: int, b: int) -> dict:
        self.proc.stdin.write(f"{a} {b}\n")
        self.proc.stdin.flush()
        return self.wait_file(f"{self.method}.{a}.json")

    def close(self) -> None:
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def pooled(method: str, startup: dict, chunks: list[dict]) -> dict:
    """One method's record over all chunks, in vllm_bench's shape (its table reads it)."""
    total = {k: sum(c[k] for c in chunks) for k in
             ("wall_s", "output_tokens", "num_drafts", "num_draft_tokens", "num_accepted_tokens")}
    per_pos = [0] * max(len(c["accepted_per_pos"]) for c in chunks)
    for c in chunks:
        for i, x in enumerate(c["accepted_per_pos"]):
            per_pos[i] += x
    record = dict(startup, method=method, ok=True, **total, accepted_per_pos=per_pos,
                  tokens_per_s=total["output_tokens"] / total["wall_s"],
                  acceptance=(total["num_accepted_tokens"] / total["num_draft_tokens"]
                              if total["num_draft_tokens"] else None),
                  mean_accepted_length=(1 + total["num_accepted_tokens"] / total["num_drafts"]
                                        if total["num_drafts"] else None),
                  loadavg_1m=[chunks[0]["loadavg_1m"][0], chunks[-1]["loadavg_1m"][1]],
                  outputs=[o for c in chunks for o in c["outputs"]],
                  chunks=[{k: v for k, v in c.items() if k != "outputs"} for c in chunks])
    if all("prefill_s" in c for c in chunks):
        record["prefill_s"] = sum(c["prefill_s"] for c in chunks)
        record["decode_s"] = sum(c["decode_s"] for c in chunks)
    return record


def paired(record: dict, ref: dict, draws: int = 2000) -> dict:
    """`record` against `ref` chunk by chunk: pooled ratio, geometric mean, bootstrap interval."""
    mine = [(c["output_tokens"], c["wall_s"]) for c in record["chunks"]]
    theirs = [(c["output_tokens"], c["wall_s"]) for c in ref["chunks"]]

    def ratio(idx):
        return ((sum(mine[i][0] for i in idx) / sum(mine[i][1] for i in idx))
                / (sum(theirs[i][0] for i in idx) / sum(theirs[i][1] for i in idx)))

    n = len(mine)
    logs = [math.log((m[0] / m[1]) / (t[0] / t[1])) for m, t in zip(mine, theirs)]
    rng = random.Random(0)
    boot = sorted(ratio([rng.randrange(n) for _ in range(n)]) for _ in range(draws))
    return dict(pooled=ratio(range(n)), geomean=math.exp(sum(logs) / n),
                low=boot[int(0.05 * draws)], high=boot[int(0.95 * draws) - 1],
                chunks_ahead=sum(x > 0 for x in logs), chunks=n)


def paired_table(records: list[dict], reference: str) -> str:
    """The chunk-by-chunk comparison with `reference` (also stored in each record)."""
    ref = next(r for r in records if r["method"] == reference)
    lines = [f"| method | vs {reference}: pooled | geometric mean of chunks | 90% interval (bootstrap) | chunks ahead |",
             "|---|---|---|---|---|"]
    for r in records:
        if r["method"] == reference:
            continue
        p = paired(r, ref)
        r[f"vs_{reference}"] = p
        lines.append(f"| {r['method']} | {p['pooled']:.3f}× | {p['geomean']:.3f}× | "
                     f"{p['low']:.3f}–{p['high']:.3f} | {p['chunks_ahead']}/{p['chunks']} |")
    return "\n".join(lines)


def combined_table(dirs: list[str], reference: str) -> str:
    """`--combine`: every method's chunks from the runs written to `dirs`, compared with `reference`.

    Raises:
        SystemExit: a directory without a readable summary.json of an interleaved run, runs with
            other settings, or a reference that is not in every run.
    """
    summaries = []
    for d in dirs:
        path = Path(d) / "summary.json"
        try:
            summaries.append(json.loads(path.read_text()))
        except (OSError, ValueError) as error:
            raise SystemExit(f"vllm_interleave --combine: cannot read {path} ({error}); "
                             f"give the --out directories of earlier runs") from None
        rows = summaries[-1].get("rows") if isinstance(summaries[-1], dict) else None
        if not isinstance(rows, list) or not all(isinstance(r, dict) and "chunks" in r for r in rows):
            raise SystemExit(f"vllm_interleave --combine: {path} holds no chunks: give the --out "
                             f"directories of earlier vllm_interleave.py runs (not vllm_bench.py's)")
    same = ("workload", "requests", "max_num_seqs", "max_tokens", "num_spec", "threads", "dtype", "device")
    first = summaries[0]["settings"]
    for d, summary in zip(dirs[1:], summaries[1:]):
        differ = [k for k in same if summary["settings"].get(k) != first.get(k)]
        if differ:
            raise SystemExit(f"vllm_interleave --combine: {d} differs from {dirs[0]} in {', '.join(differ)}")
    methods = [r["method"] for r in summaries[0]["rows"]
               if all(any(x["method"] == r["method"] for x in s["rows"]) for s in summaries[1:])]
    if reference not in methods:
        raise SystemExit(f"vllm_interleave --combine: --reference {reference} is not in every run "
                         f"(common methods: {', '.join(methods)})")
    records = [dict(method=m, chunks=[c for s in summaries for r in s["rows"] if r["method"] == m
                                      for c in r["chunks"]]) for m in methods]
    return (f"{len(dirs)} runs pooled, {WORKLOADS[first['workload']].title}, max_num_seqs {first['max_num_seqs']}: "
            f"{', '.join(dirs)}\n\n{paired_table(records, reference)}")


def serve_chunks(engines: dict, n: int, size: int) -> dict:
    """Run every chunk on every engine, the order rotated by one per chunk."""
    from tqdm import tqdm

    methods = list(engines)
    results = {m: [] for m in methods}
    starts = list(range(0, n, size))
    for k, a in enumerate(tqdm(starts, desc="vllm_interleave", unit="chunk", file=sys.stderr)):
        b = min(a + size, n)
        order = methods[k % len(methods):] + methods[:k % len(methods)]
        for m in order:
            result = engines[m].run(a, b)
            if not result.get("ok"):
                raise RuntimeError(f"{m}, requests {a}-{b}: {result.get('error')}")
            results[m].append(dict(result, chunk=k, first_request=a, position=order.index(m)))
    return results


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, args = parse_args(argv)
    if ours.combine:
        print(combined_table(ours.combine, ours.reference))
        return 0
    env = vb.setup_env(args)
    if ours.worker:
        return child(ours.worker, Path(ours.io), args)
    vllm_records.source_state()  # the code as the run starts (cached for the report)
    vllm_records.build_kernels(args.device)  # not inside the first engine's timed start
    import tempfile

    source, reqs, warm = vb.load_workload(args)
    out_dir = Path(args.out) if args.out else None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
    io = Path(tempfile.mkdtemp(prefix="vllm-interleave-"))
    (io / "workload.json").write_text(json.dumps(dict(source=source, reqs=reqs, warm=warm)))
    print(f"vllm_interleave: {len(reqs)} requests ({args.workload}) in chunks of {ours.chunk}, "
          f"max_num_seqs {args.max_num_seqs}, methods {', '.join(args.method_list)}", flush=True)
    engines: dict[str, Engine] = {}
    startup: dict[str, dict] = {}
    try:
        for m in args.method_list:  # one at a time: start-ups do not overlap
            engines[m] = Engine(m, io, argv)
            startup[m] = engines[m].wait_file(f"{m}.ready")
            if not startup[m].get("ok"):
                raise RuntimeError(f"{m} failed to start: {startup[m].get('error')}")
        results = serve_chunks(engines, len(reqs), ours.chunk)
    finally:
        for e in engines.values():
            e.close()
        shutil.rmtree(io, ignore_errors=True)  # the workload file and the engines' hand-offs
    records = [pooled(m, {k: v for k, v in startup[m].items() if k != "ok"}, results[m])
               for m in args.method_list]
    base = records[0]
    for r in records:
        vllm_records.compare(r, base)
    report(records, base, ours, args, env, out_dir, len(reqs))
    return 0


def report(records, base, ours, args, env, out_dir, n) -> None:
    """Print both tables; under --out write each method's record, table.md and summary.json."""
    isolation = (f"each method a vLLM engine in a process of its own, all alive; chunks of "
                 f"{ours.chunk} requests served by each in turn, the order rotated per chunk")
    envinfo = vllm_records.environment(args, env, isolation)
    title = (f"vLLM {envinfo['vllm']} in-engine, {WORKLOADS[args.workload].title} ({n} requests), "
             f"max_num_seqs {args.max_num_seqs}, max_tokens {args.max_tokens}, K={args.num_spec}, "
             f"{args.device}, threads {args.threads} (bind {env.get('VLLM_CPU_OMP_THREADS_BIND')}), "
             f"{args.dtype}, greedy; {isolation}")
    pairs = paired_table(records, ours.reference)
    markdown = f"{title}\n\n{vllm_records.table(records, base)}\n\n{pairs}\n"
    print("\n" + markdown, flush=True)
    if out_dir is None:
        return
    settings = dict(workload=args.workload, requests=n, chunk=ours.chunk, reference=ours.reference,
                    max_num_seqs=args.max_num_seqs, max_tokens=args.max_tokens,
                    num_spec=args.num_spec, threads=args.threads, oilbird_set=args.set,
                    node_budget=args.node_budget, dtype=args.dtype, device=args.device)
    for r in records:
        (out_dir / f"{r['method']}.json").write_text(json.dumps(dict(r, settings=settings), indent=1) + "\n")
    (out_dir / "table.md").write_text(markdown)
    summary = dict(settings=settings, environment=envinfo, table=markdown,
                   rows=[{k: v for k, v in r.items() if k != "outputs"} for r in records])
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":  # required: vLLM spawns processes that re-import this module
    sys.exit(main())
