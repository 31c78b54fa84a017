"""Reading the GGUF's own 4-bit weights against their float32 copy: the measurement behind `q4_rows`.

Stop 43's command, kept runnable: it is now `scripts/forward_ab.py` with side a the float32 copy
(`q4_rows=0`) and side b the Q4_1 blocks up to the largest row count the run times (the chain
sizes, the `--prefill` lengths and, with `--bench`, `--q4-rows`). Its output names the sides by
those configurations.

Usage:
  .venv/bin/python scripts/q4_ab.py --threads 2
  .venv/bin/python scripts/q4_ab.py --threads 2 --q4-rows 64 --bench 20 --per-category 5 --methods suffix,oilbird
"""

from __future__ import annotations

import argparse
import sys

import forward_ab  # scripts/ is on sys.path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="1,2,4,6,8,12,16,24,32,48,64")
    p.add_argument("--prefill", default="")
    p.add_argument("--bench", type=int, default=0)
    p.add_argument("--q4-rows", type=int, default=32, help="the blocks' row limit in --bench")
    args, rest = p.parse_known_args()
    rows = [int(n) for n in (args.sizes + "," + args.prefill).split(",") if n]
    limit = max(rows + ([args.q4_rows] if args.bench else []))
    sys.argv = [sys.argv[0], "--a", "q4_rows=0", "--b", f"q4_rows={limit}", "--sizes", args.sizes,
                "--bench", str(args.bench), *(["--prefill", args.prefill] if args.prefill else []), *rest]
    forward_ab.main()


if __name__ == "__main__":
    main()
