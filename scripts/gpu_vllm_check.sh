#!/usr/bin/env bash
# The in-engine comparison of scripts/vllm_bench.py on ONE NVIDIA GPU: the make-bench slice
# (--workload slice, 20 API-Bank requests) with none, ngram, suffix, oilbird, oilbird-pld, sam and
# goose, at max_num_seqs 1 and then 8 (--device cuda, --isolation inproc, --resume).
#
# Needs: one NVIDIA GPU, and vLLM's CUDA build installed beside oilbird in the Python $PY (default
# `python`), e.g.  pip install -e . vllm==0.33.0 arctic-inference   (arctic-inference: vLLM's
# `suffix` method; without it that row reads FAILED). Also the shared datasets folder (API-Bank,
# ../shared/datasets or as oilbird finds it) and oilbird's default model in its cache -- the machine
# may have no network. The script first checks
#   $PY -c "import vllm, torch; assert torch.cuda.is_available()"
# and stops with a message (exit 2) when that fails.
#
# Time budget: 8 minutes in all (BUDGET_S=480), checks included. Each table runs under `timeout`:
# max_num_seqs 1 gets half of what is left (all of it when half is under a minute), max_num_seqs 8
# the rest, less a reserve for the report; a table with under a minute left is skipped, and the
# report says what was cut short or skipped.
# --resume keeps every finished method, so running the script again goes on where it stopped.
#
# Writes (OUT defaults to ./out; the device tool sets $OUT):
#   $OUT/vllm-gpu-slice-seqs1/, $OUT/vllm-gpu-slice-seqs8/   <method>.json, summary.json, table.md
#   $OUT/vllm-gpu-slice-seqs1.log, ...-seqs8.log              the runs' stdout and stderr
#   $OUT/gpu_vllm_report.md                                   both tables, command lines, GPU,
#                                                             git revision, versions (also printed)
# Exit status: 0 both tables complete; 1 a table was cut short, failed or skipped; 2 no CUDA vLLM.
#
# usage: scripts/gpu_vllm_check.sh                 (PY=/path/to/python OUT=dir BUDGET_S=480)
set -u

START=$SECONDS
BUDGET=${BUDGET_S:-480}
RESERVE=20       # seconds kept for the report
MIN_STEP=60      # a table with less time than this is skipped
KILL_GRACE=10    # timeout -k: SIGKILL this long after SIGTERM
METHODS=none,ngram,suffix,oilbird,oilbird-pld,sam,goose

PY=${PY:-python}
case $PY in */*) PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")" ;; esac  # before the cd
OUT=${OUT:-./out}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd) || { echo "cannot create OUT=$OUT" >&2; exit 2; }
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 2
export VLLM_NO_USAGE_STATS=${VLLM_NO_USAGE_STATS:-1}

left() { echo $((BUDGET - (SECONDS - START))); }
shown() {  # a command line to copy: quote only what needs it
    local a out=()
    for a in "$@"; do
        if [[ $a =~ ^[A-Za-z0-9_./,=:+@%-]+$ ]]; then out+=("$a"); else out+=("$(printf '%q' "$a")"); fi
    done
    echo "${out[*]}"
}

echo "== gpu_vllm_check: PY=$PY OUT=$OUT budget ${BUDGET}s"
if ! timeout -k 5 150 "$PY" -c "import vllm, torch; assert torch.cuda.is_available()"; then
    echo "gpu_vllm_check: '$PY' cannot import vLLM and torch with a CUDA device" \
         "(python -c \"import vllm, torch; assert torch.cuda.is_available()\" failed)." >&2
    echo "Needs one NVIDIA GPU and vLLM's CUDA build beside oilbird: pip install -e . vllm==0.33.0" \
         "arctic-inference; set PY to that Python." >&2
    exit 2
fi
if ! timeout -k 5 60 "$PY" -c "import oilbird.integrations.vllm"; then
    echo "gpu_vllm_check: '$PY' cannot import oilbird (pip install -e . beside vLLM)." >&2
    exit 2
fi
VERSIONS=$(timeout -k 5 60 "$PY" - <<'EOF' 2>&1
import importlib.metadata as md
import platform
def v(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return "not installed"
import torch
print(f"python {platform.python_version()}, vllm {v('vllm')}, torch {v('torch')} "
      f"(CUDA {torch.version.cuda}), transformers {v('transformers')}, "
      f"arctic-inference {v('arctic-inference')}, oilbird {v('oilbird')}")
EOF
)
SMI=$(timeout -k 5 30 nvidia-smi -L 2>&1 || echo "(nvidia-smi -L failed)")
REV=$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo "unknown (not a git checkout)")
if [ -n "$(git -C "$ROOT" status --porcelain --untracked-files=no 2>/dev/null)" ]; then
    REV="$REV (with uncommitted changes; summary.json records a digest of src/)"
fi
echo "$SMI"
echo "$VERSIONS"
echo "git $REV"
case $VERSIONS in *"arctic-inference not installed"*)
    echo "note: arctic-inference is not installed: the suffix row will read FAILED" ;;
esac

declare -A CMD STATUS
SEQS=(1 8)
FAILED=0
for i in "${!SEQS[@]}"; do
    seqs=${SEQS[$i]}
    name=vllm-gpu-slice-seqs$seqs
    dir=$OUT/$name
    cmd=("$PY" scripts/vllm_bench.py --device cuda --workload slice --methods "$METHODS"
         --max-num-seqs "$seqs" --isolation inproc --resume --out "$dir")
    CMD[$seqs]=$(shown "${cmd[@]}")
    steps_left=$(( ${#SEQS[@]} - i ))
    limit=$(( ($(left) - RESERVE) / steps_left - KILL_GRACE ))
    if [ "$limit" -lt "$MIN_STEP" ]; then  # too little to share: this table gets all that is left
        limit=$(( $(left) - RESERVE - KILL_GRACE ))
    fi
    if [ "$limit" -lt "$MIN_STEP" ]; then
        STATUS[$seqs]="SKIPPED: only $(left)s of the ${BUDGET}s budget left; run the script again (--resume)"
        echo "== $name: ${STATUS[$seqs]}"
        FAILED=1
        continue
    fi
    mkdir -p "$dir"
    rm -f "$dir/table.md"  # only this run's table counts
    echo "== $name (timeout ${limit}s): ${CMD[$seqs]}"
    t0=$SECONDS
    timeout -k "$KILL_GRACE" "$limit" "${cmd[@]}" >> "$dir.log" 2>&1
    rc=$?
    took=$((SECONDS - t0))
    if [ -f "$dir/table.md" ] && [ "$rc" -eq 0 ]; then
        STATUS[$seqs]="complete (${took}s)"
    elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        STATUS[$seqs]="CUT SHORT by the ${limit}s timeout; run the script again to go on (--resume)"
        FAILED=1
    else
        STATUS[$seqs]="FAILED: exit $rc after ${took}s; see $name.log"
        FAILED=1
    fi
    echo "   ${STATUS[$seqs]}"
done

partial() {  # the methods a cut-short run finished (their <method>.json), as a small table
    "$PY" - "$1" <<'EOF'
import json, sys
from pathlib import Path
rows = []
for path in sorted(Path(sys.argv[1]).glob("*.json")):
    if path.name == "summary.json":
        continue
    try:
        r = json.loads(path.read_text())
    except (OSError, ValueError):
        continue
    if not r.get("ok"):
        rows.append(f"| {r.get('method', path.stem)} | FAILED: {str(r.get('error'))[:120]} | | |")
        continue
    acc = "—" if r.get("acceptance") is None else f"{r['acceptance']:.3f}"
    ident = f"{r['identical']}/{len(r['outputs'])}" if "identical" in r else "—"
    rows.append(f"| {r['method']} | {r['tokens_per_s']:.1f} | {acc} | {ident} |")
if rows:
    print("Methods finished so far (no table.md; speedups need the full run):\n")
    print("| method | tokens/s | acceptance | identical to none |\n|---|---|---|---|")
    print("\n".join(rows))
else:
    print("No method finished.")
EOF
}

REPORT=$OUT/gpu_vllm_report.md
{
    echo "# vLLM in-engine comparison on one GPU (scripts/gpu_vllm_check.sh)"
    echo
    echo "- date: $(date '+%Y-%m-%d %H:%M:%S %Z'), host $(hostname)"
    echo "- git revision: $REV"
    echo "- versions: $VERSIONS"
    echo "- budget: ${BUDGET}s, used $((SECONDS - START))s"
    echo "- nvidia-smi -L:"
    echo
    echo '```'
    echo "$SMI"
    echo '```'
    for seqs in "${SEQS[@]}"; do
        dir=$OUT/vllm-gpu-slice-seqs$seqs
        echo
        echo "## max_num_seqs $seqs: ${STATUS[$seqs]}"
        echo
        echo '```'
        echo "${CMD[$seqs]}"
        echo '```'
        echo
        if [ -f "$dir/table.md" ]; then
            cat "$dir/table.md"
        elif [ -d "$dir" ]; then
            partial "$dir"
        else
            echo "Not run."
        fi
    done
} > "$REPORT"
echo
cat "$REPORT"
echo
echo "== report: $REPORT (used $((SECONDS - START))s of ${BUDGET}s)"
exit $FAILED
