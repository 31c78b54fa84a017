"""The records of a vLLM comparison: outputs checked against the `none` run, the table, the
environment a run records, and the files it writes (`table.md`, `summary.json`).

Shared by `scripts/vllm_bench.py` (one method after another) and `scripts/vllm_interleave.py`
(chunk by chunk); the runs themselves, and what each column means, are described in
vllm_bench.py's docstring.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from functools import lru_cache
from pathlib import Path

from workloads import WORKLOADS  # scripts/ is on sys.path


def resumable(out_dir: Path | None, method: str, settings: dict) -> dict | None:
    """`--resume`: the method's finished record from an earlier run with these settings, if any."""
    path = out_dir / f"{method}.json" if out_dir is not None else None
    if path is None or not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    old = record.get("settings")
    if isinstance(old, dict) and "device" not in old:  # written before --device: a cpu run
        old = dict(old, device="cpu")
    return record if record.get("ok") and old == settings else None


def compare(record: dict, base: dict | None) -> None:
    """Fill `identical`/`differing`/`first_diff` against the `none` run."""
    if not record.get("ok") or base is None or not base.get("ok"):
        return
    diffs = []
    for mine, ref in zip(record["outputs"], base["outputs"]):
        a, b = mine["output_ids"], ref["output_ids"]
        if a != b:
            pos = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            diffs.append(dict(id=mine["id"], position=pos))
    record["identical"] = len(record["outputs"]) - len(diffs)
    record["differing"] = diffs
    record["first_diff"] = min((d["position"] for d in diffs), default=None)


def fmt(value, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def table(records: list[dict], base: dict | None) -> str:
    head = ("| method | tokens/s | speedup | acceptance | mean acc. len | drafts | draft tok | "
            "accepted | identical to none | first diff pos | prefill s | decode s | startup s | load 1m |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    base_tps = base.get("tokens_per_s") if base and base.get("ok") else None
    for r in records:
        if not r.get("ok"):
            lines.append(f"| {r['method']} | FAILED: {r.get('error', '?')[:160]} |" + " |" * 12)
            continue
        speed = r["tokens_per_s"] / base_tps if base_tps else None
        n = len(r["outputs"])
        ident = f"{r['identical']}/{n}" if "identical" in r else "—"
        lines.append(
            f"| {r['method']} | {r['tokens_per_s']:.1f} | {fmt(speed, '.2f')}× | "
            f"{fmt(r['acceptance'], '.3f')} | {fmt(r['mean_accepted_length'], '.2f')} | "
            f"{r['num_drafts']} | {r['num_draft_tokens']} | {r['num_accepted_tokens']} | {ident} | "
            f"{fmt(r.get('first_diff'), 'd')} | {fmt(r.get('prefill_s'), '.1f')} | "
            f"{fmt(r.get('decode_s'), '.1f')} | {r['startup_s']:.0f} | "
            f"{r['loadavg_1m'][0]:.1f}→{r['loadavg_1m'][1]:.1f} |")
    return "\n".join(lines)


def build_kernels(device: str) -> None:
    """Compile our CPU kernels in this process, before any engine starts (on a CPU run).

    A cold build inside vLLM's CPU worker runs bound to the worker's one core and lands in that
    engine's start-up: 271 s and 318 s against 16-24 s for the other engines of stop 48's and
    stop 53's runs, each the first engine of its run to load our kernels after their sources changed.
    """
    if device == "cpu":
        from oilbird.skinny_gemm import skinny_available

        skinny_available()


@lru_cache(maxsize=1)
def source_state() -> dict:
    """Which oilbird code ran: the commit and a digest of the uncommitted changes under src/.

    Read once per process: the scripts call it as a run starts, so a commit made while the run
    goes on (a long one) is not recorded as the code that ran."""
    import hashlib

    root = Path(__file__).resolve().parents[1]

    def git(*cmd: str) -> str:
        try:
            return subprocess.run(["git", *cmd], cwd=root, capture_output=True, text=True,
                                  timeout=30).stdout
        except (OSError, subprocess.SubprocessError):
            return ""

    diff = git("diff", "HEAD", "--", "src")
    untracked = git("ls-files", "--others", "--exclude-standard", "--", "src").split()
    digest = hashlib.sha256(diff.encode())
    for name in sorted(untracked):
        digest.update(name.encode() + (root / name).read_bytes())
    return dict(commit=git("rev-parse", "HEAD").strip(), src_changes_sha256=digest.hexdigest()[:16],
                src_files_changed=git("diff", "HEAD", "--name-only", "--", "src").split() + untracked)


def cuda_device_name() -> str:
    """torch.cuda.get_device_name() of the GPU vLLM will use, asked in a subprocess so that this
    process does not initialise CUDA before vLLM starts its engine processes."""
    code = ("import torch, sys\n"
            "if not torch.cuda.is_available(): sys.exit('torch.cuda.is_available() is False')\n"
            "print(torch.cuda.get_device_name())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"--device cuda: no CUDA device: {(done.stderr or done.stdout).strip()[-500:]}")
    lines = done.stdout.strip().splitlines()
    return lines[-1] if lines else "unknown CUDA device"


def environment(args, env: dict, isolation: str, device_name: str | None = None) -> dict:
    import platform

    import torch
    import vllm

    try:
        import arctic_inference  # noqa: F401
        arctic = "importable"
    except ImportError as error:
        arctic = f"not importable: {error}"
    device = dict(device=args.device, dtype=args.dtype)
    if args.device == "cuda":
        device.update(device_name=device_name, cuda=torch.version.cuda,
                      gpu_memory_utilization=args.gpu_memory_utilization)
    return dict(python=platform.python_version(), vllm=vllm.__version__, torch=torch.__version__,
                **device, source=source_state(),
                cpus=os.cpu_count(), allowed_cpus=sorted(os.sched_getaffinity(0)),
                processor=platform.processor() or platform.machine(), env=env,
                arctic_inference=arctic, isolation=isolation,
                time=time.strftime("%Y-%m-%d %H:%M:%S %Z"))


def report(args, env: dict, isolation: str, device_name: str | None, settings: dict, records: list[dict],
           base: dict | None, out_dir: Path | None) -> None:
    """Print the run's table under its title and notes; under `out_dir`, write `table.md` and
    `summary.json` (the settings, the environment, every row without its outputs)."""
    text = table(records, base)
    envinfo = environment(args, env, isolation, device_name)
    if args.device == "cpu":
        where = (f"cpu, threads {args.threads} (bind {settings['bind']}"
                 f"{', libiomp5 preloaded' if args.iomp else ''}, numba layer {args.numba_threading_layer})")
    else:
        where = (f"cuda {device_name} (gpu_memory_utilization {args.gpu_memory_utilization}, "
                 f"numba layer {args.numba_threading_layer})")
    title = (f"vLLM {envinfo['vllm']} in-engine, {WORKLOADS[args.workload].title} ({settings['requests']} requests), "
             f"max_num_seqs {args.max_num_seqs}, max_tokens {args.max_tokens}, K={args.num_spec}, "
             f"{where}, {args.dtype}, greedy; {isolation}")
    notes = [f"- {r['method']}: {r.get('error')}" for r in records if not r.get("ok")]
    resumed = [r["method"] for r in records if r.get("resumed")]
    if resumed:
        notes.append(f"- measured by an earlier, interrupted run with the same settings (--resume): "
                     f"{', '.join(resumed)}")
    if "suffix" in args.method_list and envinfo["arctic_inference"] != "importable":
        notes.append(f"- suffix: arctic-inference {envinfo['arctic_inference']}")
    markdown = f"{title}\n\n{text}\n" + ("\n" + "\n".join(notes) + "\n" if notes else "")
    print("\n" + markdown, flush=True)
    if out_dir is not None:
        (out_dir / "table.md").write_text(markdown)
        summary = dict(settings=settings, environment=envinfo, table=markdown,
                       rows=[{k: v for k, v in r.items() if k not in ("outputs", "settings")}
                             for r in records])
        (out_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
