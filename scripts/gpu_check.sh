#!/usr/bin/env bash
# Our engine on ONE NVIDIA GPU, in bfloat16, within 8 minutes: the verifier's cost curve
# (`oilbird cost`) and the make-bench methods on a slice of API-Bank (`oilbird bench`: ar, pld,
# sam, suffix, tr, goose, oilbird at the budget chosen for the GPU, each audited token for token
# against transformers' generate() in the same dtype), then a short report.
#
# Needs: a CUDA build of torch and oilbird importable from $PY (default `python`; e.g.
# `pip install -e . --no-deps` beside the machine's torch and transformers, or PYTHONPATH=src),
# the shared datasets (../shared/datasets or as oilbird finds them) and the default model in
# oilbird's cache (the machine may have no network). The script first checks
#   $PY -c "import torch, oilbird; assert torch.cuda.is_available()"
# and stops with a message (exit 2) when that fails.
#
# Time budget: BUDGET_S=480 seconds in all. The cost curve gets at most 150 s; the bench gets
# what is left less a reserve for the report, and keeps and summarises the requests it finished
# when its time runs out (SIGTERM), so a slow GPU still yields a table.
#
# Writes (OUT defaults to ./out; the device tool sets $OUT):
#   $OUT/gpu-cost.txt        the cost curve (ms per forward and x the one-node forward)
#   $OUT/gpu-bench/          records.jsonl, summary.json, table.md of the bench
#   $OUT/gpu_report.md       both tables, the commands, GPU, git revision and versions (also printed)
# Exit status: 0 both parts complete; 1 a part failed or was cut short; 2 no CUDA torch/oilbird.
#
# usage: scripts/gpu_check.sh                 (PY=/path/to/python OUT=dir BUDGET_S=480 DTYPE=bfloat16)
set -u

START=$SECONDS
BUDGET=${BUDGET_S:-480}
RESERVE=20
DTYPE=${DTYPE:-bfloat16}
METHODS=pld,sam,suffix,tr,goose,oilbird
PY=${PY:-python}
case $PY in */*) PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")" ;; esac
OUT=${OUT:-./out}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd) || { echo "cannot create OUT=$OUT" >&2; exit 2; }
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 2
left() { echo $((BUDGET - (SECONDS - START))); }

echo "== gpu_check: PY=$PY OUT=$OUT dtype $DTYPE budget ${BUDGET}s"
if ! timeout -k 5 120 "$PY" -c "import torch, oilbird.cli; assert torch.cuda.is_available()"; then
    echo "gpu_check: '$PY' cannot import torch with a CUDA device and oilbird" \
         "(python -c \"import torch, oilbird.cli; assert torch.cuda.is_available()\" failed)." >&2
    echo "Needs one NVIDIA GPU, a CUDA build of torch and oilbird (pip install -e . --no-deps," \
         "or PYTHONPATH=src); set PY to that Python." >&2
    exit 2
fi
VERSIONS=$(timeout -k 5 60 "$PY" -c "
import platform, torch, transformers
print(f'python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda}), '
      f'transformers {transformers.__version__}')" 2>&1)
SMI=$(timeout -k 5 30 nvidia-smi -L 2>&1 || echo "(nvidia-smi -L failed)")
REV=$(git rev-parse --short HEAD 2>/dev/null || echo "unknown")
status=0

COST=("$PY" -m oilbird.cli cost --device cuda --dtype "$DTYPE" --budget-grid 1,2,4,8,16,32,64,128)
echo "== $(printf '%q ' "${COST[@]}")"
timeout -k 10 $(( $(left) < 150 ? $(left) : 150 )) "${COST[@]}" >"$OUT/gpu-cost.txt" 2>"$OUT/gpu-cost.log"
rc=$?
[ $rc -eq 0 ] || { echo "cost curve failed or was cut short (rc $rc; see $OUT/gpu-cost.log)"; status=1; }
cat "$OUT/gpu-cost.txt"

BENCH=("$PY" -m oilbird.cli bench --device cuda --dtype "$DTYPE" --dataset api-bank --per-category 5
       --limit 20 --max-new-tokens 64 --methods "$METHODS" --budget auto --no-progress --out "$OUT/gpu-bench")
T=$(( $(left) - RESERVE ))
if [ "$T" -lt 60 ]; then
    echo "bench skipped: ${T}s left"; status=1
else
    echo "== $(printf '%q ' "${BENCH[@]}") (timeout ${T}s)"
    timeout -s TERM -k 20 "$T" "${BENCH[@]}" >"$OUT/gpu-bench.txt" 2>"$OUT/gpu-bench.log"
    rc=$?
    # 3: a strict method diverged from generate() (the table says where); 124: cut short, summarised.
    [ $rc -eq 0 ] || { echo "bench exit status $rc (see $OUT/gpu-bench.log)"; status=1; }
    cat "$OUT/gpu-bench.txt"
fi

{
    echo "# Oilbird engine on a GPU ($DTYPE), $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    echo "- GPU: $SMI"
    echo "- versions: $VERSIONS; oilbird at git $REV"
    echo "- commands: \`${COST[*]}\`; \`${BENCH[*]}\`"
    echo "- wall: $((SECONDS - START)) s of a ${BUDGET} s budget; exit status $status"
    echo
    echo "## Cost curve"
    echo
    cat "$OUT/gpu-cost.txt" 2>/dev/null
    echo
    echo "## make-bench methods on the 20-request slice"
    echo
    cat "$OUT/gpu-bench.txt" 2>/dev/null
} >"$OUT/gpu_report.md"
echo "== report: $OUT/gpu_report.md"
exit $status
