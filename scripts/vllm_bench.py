"""In-engine comparison inside vLLM: no speculation vs vLLM's `ngram` and `suffix` vs our drafters.

One run of this script is one table. Every method serves the same requests, given to vLLM as token
ids (TokensPrompt, encoded exactly as `oilbird bench` encodes them), greedy (temperature 0), with
the same engine settings; only `speculative_config` (and, for ours, the worker class) differs:

  none          no speculation, async scheduling off like every speculative engine (vLLM turns
                it off for ngram, suffix and custom_class): the baseline of every other row
  none-async    no speculation with async scheduling, vLLM's own default without speculation
  ngram         vLLM's prompt lookup     {"method": "ngram", "num_speculative_tokens": K, ...}
  suffix        vLLM's SuffixDecoding    {"method": "suffix", ...}; needs arctic-inference
  <ours>        any method of our registry (`oilbird list`): oilbird, oilbird-pld, sam, goose, ...
                {"method": "custom_class", "model": "oilbird.integrations.vllm.OilbirdProposer"},
                worker_cls OilbirdCPUWorker (OilbirdGPUWorker with --device cuda),
                additional_config {"oilbird": {"method": <ours>}}

A vLLM `LLM` holds one speculative config, so each method is its own `LLM`, built, warmed up,
timed and shut down in turn (`--isolation process`: each in a fresh subprocess of this script
instead, back to back on the same machine). Per method:
  tokens/s       output tokens / wall time of the one timed `LLM.generate` over all requests
                 (engine start-up and the warm-up excluded), pooled
  speedup        tokens/s / the `none` row's
  acceptance     accepted / draft tokens, from vLLM's spec-decode counters (LLM.get_metrics(),
                 deltas over the timed generate)
  mean acc. len  1 + accepted / drafts (vLLM's "mean acceptance length"; a draft = one request-step
                 that carried draft tokens)
  identical      requests whose output token ids equal the `none` run's; for the others the first
                 differing position (min over requests)
  prefill/decode s  summed over requests, from the engine core's timestamps (scheduled -> first
                 token -> last token)
  load 1m        the machine's 1-minute load average before -> after the timed generate (other
                 work on the machine skews tokens/s; compare rows with similar load)

Workloads (`--workload`):
  slice   the `make bench` slice: `oilbird bench --dataset api-bank --per-category 5 --limit 20`
  stream  the 100-request API-Bank stream: 25 per file, the four files in stream order
  spec-bench  52 Spec-Bench questions, 4 per category (`oilbird bench --dataset spec-bench
          --per-category 4 --limit 52`)
`--limit N` keeps the first N requests of the workload (smoke tests).

Device: `--device cpu` (the default; vLLM's CPU build) or `--device cuda` (vLLM's CUDA build, one
GPU: our methods then use worker_cls OilbirdGPUWorker, LLM(...) gets `--gpu-memory-utilization`,
default 0.5, and the device name -- torch.cuda.get_device_name() -- goes into the settings and the
title). `--dtype` defaults to float32 on cpu and bfloat16 on cuda. Device and dtype are part of
the settings that `--resume` compares (a record without a device is a cpu one).

Threads (--device cpu): `--threads N` sets vLLM's CPU OpenMP binding VLLM_CPU_OMP_THREADS_BIND to
the first N allowed CPUs (vLLM then sets OMP_NUM_THREADS=N and the affinity in its worker) and
torch's threads in this process. `--bind` overrides the binding string as vLLM takes it ('auto'
reserves one core for vLLM's scheduler process; 'nobind' leaves OpenMP alone). `--iomp` puts the
venv's Intel OpenMP (lib/libiomp5.so) in LD_PRELOAD, the set-up vLLM's warning asks for
("Speculative decoding on CPU without Intel OpenMP in LD_PRELOAD will cause significant performance
loss"). vLLM's ngram proposer runs numba `parallel=True` code and calls numba's set_num_threads
around it; with numba's OpenMP threading layer (its default here) that leaves the calling thread --
the worker's, which also runs the model -- at ONE OpenMP thread (torch.get_num_threads() 2 -> 1),
so the ngram row would run the model single-threaded while every other row runs --threads. The
script therefore sets NUMBA_THREADING_LAYER=workqueue (`--numba-threading-layer omp`: as shipped).
With --device cuda none of vLLM's CPU settings is made (no VLLM_CPU_KVCACHE_SPACE, no
VLLM_CPU_OMP_THREADS_BIND, no LD_PRELOAD; --bind, --iomp and --kv-space are refused); --threads
then only sets torch's threads in this process, and NUMBA_THREADING_LAYER is set as on cpu.

Output: the table on stdout; under --out DIR one JSON per method (`<method>.json`: settings,
numbers, counters, output ids per request), `summary.json` and `table.md`.

Usage (vLLM lives in its own venv; `make vllm` builds .venv-vllm):
  VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python scripts/vllm_bench.py \
      --workload slice --max-num-seqs 1 --threads 2 --out out/vllm-bench-slice-seqs1
  .venv-vllm/bin/python scripts/vllm_bench.py --limit 4 --out /tmp/smoke          # smoke test
  .venv-vllm/bin/python scripts/vllm_bench.py --methods none,ngram,sam --workload stream --max-num-seqs 8
  python scripts/vllm_bench.py --device cuda --max-num-seqs 8 --out out/gpu     # vLLM's CUDA build
(scripts/gpu_vllm_check.sh runs the slice on one GPU at max_num_seqs 1 and 8.)
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

from vllm_records import build_kernels, compare, cuda_device_name, fmt, report, resumable, source_state  # scripts/ is on sys.path
from workloads import WORKLOADS, tenant_of

DEFAULT_METHODS = "none,none-async,ngram,suffix,oilbird,oilbird-pld,sam,goose"
COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
            "vllm:spec_decode_num_accepted_tokens")
WARMUP_PROMPT = "List the numbers from one to twenty, separated by commas."


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--methods", default=DEFAULT_METHODS,
                   help=f"comma list; 'none' is always run first (default: {DEFAULT_METHODS})")
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="slice")
    p.add_argument("--limit", type=int, default=0, help="serve only the first N requests (0: all)")
    p.add_argument("--max-num-seqs", type=int, default=1, help="vLLM's max_num_seqs (1 or 8 ...)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--num-spec", type=int, default=8,
                   help="num_speculative_tokens for every speculative method (default 8)")
    p.add_argument("--ngram-min", type=int, default=None,
                   help="ngram's prompt_lookup_min (default: vLLM's, 5 when neither is given)")
    p.add_argument("--ngram-max", type=int, default=None, help="ngram's prompt_lookup_max")
    p.add_argument("--node-budget", type=int, default=None,
                   help="our drafters' tree budget per step (default: EngineDrafterConfig's)")
    p.add_argument("--set", action="append", default=[], metavar="[TAG:]FIELD=VALUE",
                   help="another EngineDrafterConfig field for our methods, e.g. min_reach=0.2 "
                        "(repeatable); with TAG: only for the method written NAME#TAG, e.g. "
                        "--methods oilbird,oilbird#r3 --set r3:max_batch_reach=0.3")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cpu: vLLM's CPU build (default); cuda: vLLM's CUDA build on one GPU")
    p.add_argument("--dtype", default=None,
                   help="the model's dtype in vLLM (default: float32 on cpu, bfloat16 on cuda)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.5,
                   help="LLM(gpu_memory_utilization=...) with --device cuda (default 0.5)")
    p.add_argument("--threads", type=int, default=2,
                   help="OpenMP threads of vLLM's CPU worker (cuda: torch's threads in this process)")
    p.add_argument("--bind", default=None,
                   help="VLLM_CPU_OMP_THREADS_BIND as vLLM takes it (overrides --threads' binding)")
    p.add_argument("--iomp", action="store_true", help="LD_PRELOAD the venv's libiomp5.so")
    p.add_argument("--numba-threading-layer", default="workqueue",
                   help="NUMBA_THREADING_LAYER for vLLM's ngram proposer (default workqueue; 'omp', "
                        "numba's default here, leaves the worker's torch at 1 thread: see above)")
    p.add_argument("--kv-space", default=None,
                   help="VLLM_CPU_KVCACHE_SPACE in GiB (default: the environment's, else 1)")
    p.add_argument("--max-model-len", type=int, default=0,
                   help="0: the longest prompt + max tokens + num spec, rounded up to 256")
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument("--compile", action="store_true", help="let vLLM compile (default: enforce_eager)")
    p.add_argument("--warmup", type=int, default=1,
                   help="untimed warm-up requests per method (a fixed prompt, tenant 'warmup')")
    p.add_argument("--isolation", choices=("inproc", "process"), default="inproc",
                   help="inproc: each method an LLM in this process, one after the other; "
                        "process: each method in a fresh subprocess of this script")
    p.add_argument("--model", default=None, help="oilbird model spec (default: oilbird's default)")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--out", default=None, help="directory for <method>.json, summary.json, table.md")
    p.add_argument("--resume", action="store_true",
                   help="reuse <method>.json already in --out from a run with the same settings "
                        "(a run that was killed goes on where it stopped)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)  # process isolation: a method
    p.add_argument("--child-io", default=None, help=argparse.SUPPRESS)  # its inputs/result file
    args = p.parse_args(argv)
    if args.device == "cuda":
        given = (("--bind", args.bind), ("--iomp", args.iomp), ("--kv-space", args.kv_space))
        cpu_only = [option for option, value in given if value not in (None, False)]
        if cpu_only:
            p.error(f"{', '.join(cpu_only)}: vLLM CPU settings, not for --device cuda")
    if args.dtype is None:
        args.dtype = "bfloat16" if args.device == "cuda" else "float32"
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    args.method_list = ["none"] + [m for m in dict.fromkeys(methods) if m != "none"]
    return args


def setup_env(args) -> dict:
    """The environment vLLM reads (set before vLLM is imported); what was used, for the record."""
    if args.device == "cuda":  # none of vLLM's CPU settings; numba's layer for ngram as on cpu
        if args.numba_threading_layer:
            os.environ["NUMBA_THREADING_LAYER"] = args.numba_threading_layer
        import torch

        torch.set_num_threads(args.threads)
        keys = ("CUDA_VISIBLE_DEVICES", "LD_PRELOAD", "OMP_NUM_THREADS", "NUMBA_THREADING_LAYER")
        return {k: os.environ.get(k) for k in keys}
    if args.kv_space is not None:
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(args.kv_space)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if args.bind is not None:
        bind = args.bind
    else:
        cpus = sorted(os.sched_getaffinity(0))
        if args.threads > len(cpus):
            sys.exit(f"--threads {args.threads}: only {len(cpus)} CPUs allowed ({cpus})")
        bind = ",".join(str(c) for c in cpus[:args.threads])
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = bind
    if args.iomp:
        iomp = Path(sys.prefix) / "lib" / "libiomp5.so"
        if not iomp.is_file():
            sys.exit(f"--iomp: {iomp} not found")
        preload = os.environ.get("LD_PRELOAD", "")
        if "libiomp" not in preload:
            os.environ["LD_PRELOAD"] = f"{iomp}:{preload}" if preload else str(iomp)
    if args.numba_threading_layer:
        os.environ["NUMBA_THREADING_LAYER"] = args.numba_threading_layer
    import torch

    torch.set_num_threads(args.threads)
    keys = ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU",
            "LD_PRELOAD", "OMP_NUM_THREADS", "NUMBA_THREADING_LAYER")
    return {k: os.environ.get(k) for k in keys}


def load_workload(args) -> tuple[str, list[dict], list[int]]:
    """(model directory, requests as {id, category, prompt_ids} encoded as `oilbird bench` does,
    the warm-up prompt's ids)."""
    import torch

    from oilbird.bench import encode_requests
    from oilbird.datasets import load_dataset
    from oilbird.models import load_model

    work = WORKLOADS[args.workload]
    requests = load_dataset(work.dataset, per_category=work.per_category, limit=work.limit,
                            data_dir=Path(args.data_dir) if args.data_dir else None)
    if args.limit:
        requests = requests[:args.limit]
    loaded = load_model(args.model) if args.model else load_model()
    prompts = encode_requests(loaded, requests)
    warm = loaded.encode_chat([{"role": "user", "content": WARMUP_PROMPT}])
    source = loaded.source
    del loaded
    gc.collect()
    torch.set_num_threads(args.threads)
    reqs = [dict(id=r.id, category=r.category, prompt_ids=ids) for r, ids in zip(requests, prompts)]
    return source, reqs, warm


def engine_kwargs(method: str, args) -> dict:
    """The LLM(...) keywords that make `method` ('name#tag': the method `name` again, e.g. to
    check that the order of the runs does not matter)."""
    full, method = method, method.partition("#")[0]
    if method == "none":
        return {"async_scheduling": False}
    if method == "none-async":  # vLLM's own default without speculation
        return {"async_scheduling": True}
    if method == "ngram":
        spec = {"method": "ngram", "num_speculative_tokens": args.num_spec}
        if args.ngram_min is not None:
            spec["prompt_lookup_min"] = args.ngram_min
        if args.ngram_max is not None:
            spec["prompt_lookup_max"] = args.ngram_max
        return {"speculative_config": spec, "async_scheduling": False}
    if method == "suffix":
        return {"speculative_config": {"method": "suffix", "num_speculative_tokens": args.num_spec},
                "async_scheduling": False}
    return {"async_scheduling": False, "speculative_config": {"method": "custom_class",
                                   "model": "oilbird.integrations.vllm.OilbirdProposer",
                                   "num_speculative_tokens": args.num_spec},
            "worker_cls": ("oilbird.integrations.vllm.OilbirdGPUWorker" if args.device == "cuda"
                           else "oilbird.integrations.vllm.OilbirdCPUWorker"),
            "additional_config": {"oilbird": oilbird_options(full, args)}}


def oilbird_options(method: str, args) -> dict:
    """additional_config["oilbird"] for one of our methods: the method, --node-budget, --set."""
    from oilbird.integrations.vllm.config import EngineDrafterConfig
    from oilbird.methods import override

    method, _, tag = method.partition("#")
    items = {}
    for item in args.set:  # 'TAG:FIELD=VALUE' is for the method tagged '#TAG' only
        key, _, value = item.partition("=")
        scope, _, key = key.rpartition(":")
        if scope in ("", tag):
            items[key] = value
    if args.node_budget is not None:
        items["node_budget"] = str(args.node_budget)
    config = override(EngineDrafterConfig(method=method), items, "--set")  # fails here, not in vLLM
    return {k: v for k, v in vars(config).items() if k in items or k == "method"}


def counters(llm) -> dict:
    """The spec-decode counters now (summed over engines), and accepted tokens per position."""
    from vllm.v1.metrics.reader import Counter, Vector

    out = {name: 0 for name in COUNTERS}
    per_pos: list[int] = []
    for m in llm.get_metrics():
        if isinstance(m, Counter) and m.name in out:
            out[m.name] += m.value
        elif isinstance(m, Vector) and m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            per_pos = [a + b for a, b in zip(per_pos, m.values)] + m.values[len(per_pos):] \
                if per_pos else list(m.values)
    out["per_pos"] = per_pos
    return out


def engine_env() -> dict:
    """The environment vLLM's engine processes inherit: this process's after LLM() (vLLM's CPU
    platform adds its LD_PRELOAD here; /proc/<pid>/environ of the engine processes is useless,
    their process titles overwrite it)."""
    keys = ("LD_PRELOAD", "NUMBA_THREADING_LAYER", "VLLM_CPU_OMP_THREADS_BIND", "OMP_NUM_THREADS")
    return {k: os.environ[k] for k in keys if k in os.environ}


def shutdown(llm) -> None:
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if core is not None and hasattr(core, "shutdown"):
        try:
            core.shutdown()
        except Exception:  # noqa: BLE001 -- best effort; the next LLM must still start
            traceback.print_exc()


def sampling_params(tenant: str, max_tokens: int):
    """Greedy, token ids only, the tenant (pool) our proposer drafts from."""
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens, detokenize=False,
                          extra_args={"oilbird_tenant": tenant})


def build_llm(method: str, source: str, reqs: list[dict], warm: list[int], args, record: dict):
    """The LLM for `method`, warmed up; startup facts go into `record`."""
    from vllm import LLM
    from vllm.inputs import TokensPrompt

    longest = max(len(r["prompt_ids"]) for r in reqs)
    max_len = args.max_model_len or -(-(longest + args.max_tokens + args.num_spec + 8) // 256) * 256
    record["max_model_len"] = max_len
    t0 = time.perf_counter()
    device_kwargs = ({"gpu_memory_utilization": args.gpu_memory_utilization}
                     if args.device == "cuda" else {})
    llm = LLM(model=source, dtype=args.dtype, max_model_len=max_len,
              max_num_seqs=args.max_num_seqs, enforce_eager=not args.compile,
              enable_prefix_caching=not args.no_prefix_caching, disable_log_stats=False,
              seed=0, **device_kwargs, **engine_kwargs(method, args))
    record["startup_s"] = time.perf_counter() - t0
    record["engine_env"] = engine_env()
    if args.warmup:
        t0 = time.perf_counter()
        llm.generate([TokensPrompt(prompt_token_ids=warm)] * args.warmup,
                     sampling_params("warmup", min(16, args.max_tokens)), use_tqdm=False)
        record["warmup_s"] = time.perf_counter() - t0
    return llm


def timed_generate(llm, reqs: list[dict], args, use_tqdm: bool = True) -> dict:
    """One timed `LLM.generate` over `reqs`: wall time, vLLM's spec-decode counters (deltas),
    outputs, and the engine core's prefill/decode seconds per request."""
    from vllm.inputs import TokensPrompt

    before = counters(llm)
    prompts = [TokensPrompt(prompt_token_ids=r["prompt_ids"]) for r in reqs]
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    outs = llm.generate(prompts, sampling_params(tenant_of(args.workload), args.max_tokens), use_tqdm=use_tqdm)
    wall = time.perf_counter() - t0
    after = counters(llm)
    delta = {k: after[k] - before[k] for k in COUNTERS}
    per_pos = [a - (before["per_pos"][i] if i < len(before["per_pos"]) else 0)
               for i, a in enumerate(after["per_pos"])]
    outputs = [list(o.outputs[0].token_ids) for o in outs]
    # Engine-core timestamps per request: prefill (scheduled -> first token) and decode (first
    # -> last token), to tell where the time went.
    stats = [getattr(o, "metrics", None) for o in outs]
    timed = all(m is not None and getattr(m, "last_token_ts", 0) for m in stats)
    n_out = sum(len(o) for o in outputs)
    drafts, draft_tokens, accepted = (delta[k] for k in COUNTERS)
    result = dict(
        wall_s=wall, output_tokens=n_out, tokens_per_s=n_out / wall,
        loadavg_1m=[load_before, os.getloadavg()[0]],  # other work on the machine?
        num_drafts=drafts, num_draft_tokens=draft_tokens, num_accepted_tokens=accepted,
        accepted_per_pos=per_pos,
        acceptance=accepted / draft_tokens if draft_tokens else None,
        mean_accepted_length=1 + accepted / drafts if drafts else None,
        finish_reasons=[o.outputs[0].finish_reason for o in outs],
        outputs=[dict(id=r["id"], output_ids=ids,
                      **({"prefill_s": m.first_token_ts - m.scheduled_ts,
                          "decode_s": m.last_token_ts - m.first_token_ts} if timed else {}))
                 for r, ids, m in zip(reqs, outputs, stats)])
    if timed:
        result["prefill_s"] = sum(m.first_token_ts - m.scheduled_ts for m in stats)
        result["decode_s"] = sum(m.last_token_ts - m.first_token_ts for m in stats)
    return result


def run_method(method: str, source: str, reqs: list[dict], warm: list[int], args) -> dict:
    """Build one LLM for `method`, warm it up, time one generate over all requests, shut it down."""
    record = dict(method=method, ok=False, engine_kwargs=engine_kwargs(method, args))
    llm = None
    try:
        llm = build_llm(method, source, reqs, warm, args, record)
        record.update(timed_generate(llm, reqs, args), ok=True)
    except Exception as error:  # noqa: BLE001 -- a crashing drafter is reported, not fatal
        record.update(error=f"{type(error).__name__}: {error}", traceback=traceback.format_exc())
        traceback.print_exc()
    finally:
        if llm is not None:
            shutdown(llm)
            del llm
        gc.collect()
    return record


def run_child(method: str, source: str, reqs: list[dict], warm: list[int], args, out_dir: Path) -> dict:
    """`--isolation process`: run the method in a fresh interpreter of this very script."""
    io = out_dir / f".io-{method}.json"
    io.write_text(json.dumps(dict(source=source, reqs=reqs, warm=warm)))
    argv = [sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--child", method,
            "--child-io", str(io)]
    rc = subprocess.run(argv).returncode
    try:
        record = json.loads(io.read_text())
        if "method" not in record:
            raise ValueError("no result")
    except (OSError, ValueError):
        record = dict(method=method, ok=False, error=f"subprocess exited {rc} without a result")
    io.unlink(missing_ok=True)
    return record


def main(argv=None) -> int:
    args = parse_args(argv)
    env = setup_env(args)
    if args.child:  # process isolation: one method, result back through the io file
        io = Path(args.child_io)
        data = json.loads(io.read_text())
        record = run_method(args.child, data["source"], data["reqs"], data["warm"], args)
        record["env"] = dict(env, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS"))
        io.write_text(json.dumps(record))
        return 0

    from tqdm import tqdm

    source_state()  # the code as the run starts (cached for the report)
    build_kernels(args.device)  # not inside the first engine's timed start
    device_name = cuda_device_name() if args.device == "cuda" else None
    source, reqs, warm = load_workload(args)
    out_dir = Path(args.out) if args.out else None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
    elif args.isolation == "process":
        import tempfile

        out_dir = Path(tempfile.mkdtemp(prefix="vllm-bench-"))
    settings = dict(workload=args.workload, requests=len(reqs), limit=args.limit,
                    max_num_seqs=args.max_num_seqs, max_tokens=args.max_tokens, num_spec=args.num_spec,
                    ngram_min=args.ngram_min, ngram_max=args.ngram_max, node_budget=args.node_budget, oilbird_set=args.set,
                    threads=args.threads, bind=os.environ["VLLM_CPU_OMP_THREADS_BIND"] if args.device == "cpu" else None,
                    iomp=args.iomp,
                    numba_threading_layer=args.numba_threading_layer,
                    prefix_caching=not args.no_prefix_caching, enforce_eager=not args.compile,
                    warmup=args.warmup, tenant=tenant_of(args.workload), model=source, dtype=args.dtype,
                    temperature=0.0, prompt_tokens=sum(len(r["prompt_ids"]) for r in reqs),
                    device=args.device)
    if args.device == "cuda":
        settings.update(device_name=device_name, gpu_memory_utilization=args.gpu_memory_utilization)
    isolation = ("each method an LLM of its own, one after the other in this one process"
                 if args.isolation == "inproc" else
                 "each method in a fresh subprocess of this script, back to back")
    where = (f"threads {args.threads} (VLLM_CPU_OMP_THREADS_BIND={settings['bind']})"
             if args.device == "cpu" else f"cuda ({device_name}), {args.dtype}")
    print(f"vllm_bench: {settings['requests']} requests ({args.workload}), max_num_seqs "
          f"{args.max_num_seqs}, {where}, methods {', '.join(args.method_list)}; {isolation}", flush=True)
    records, base = [], None
    bar = tqdm(args.method_list, desc="vllm_bench", unit="method", file=sys.stderr)
    for method in bar:
        bar.set_postfix_str(method)
        previous = resumable(out_dir, method, settings) if args.resume else None
        if previous is not None:
            record = previous
            record["resumed"] = True
        elif args.isolation == "process":
            record = run_child(method, source, reqs, warm, args, out_dir)
        else:
            record = run_method(method, source, reqs, warm, args)
        if method == "none":
            base = record
        compare(record, base)
        record["settings"] = settings
        records.append(record)
        if record.get("ok"):
            tqdm.write(f"  {method}: {record['tokens_per_s']:.1f} tok/s, acceptance "
                       f"{fmt(record['acceptance'], '.3f')}, identical "
                       f"{record.get('identical', '—')}/{len(record['outputs'])}", file=sys.stderr)
        else:
            tqdm.write(f"  {method}: FAILED {record.get('error')}", file=sys.stderr)
        if out_dir is not None:
            (out_dir / f"{method}.json").write_text(json.dumps(record, indent=1) + "\n")
    bar.close()
    report(args, env, isolation, device_name, settings, records, base, out_dir)
    return 0


if __name__ == "__main__":  # required: vLLM spawns processes that re-import this module
    sys.exit(main())
