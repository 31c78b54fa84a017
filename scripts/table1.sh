#!/usr/bin/env bash
# The Table-1 comparison (docs/RESULTS.md): every drafter at the paper's fixed budget (60 nodes)
# and at the hardware-aware budget, against autoregressive decoding in the same run, audited
# token for token, on API-Bank (the four files in order, one pool), HumanEval and Spec-Bench.
#
# Usage: scripts/table1.sh MODEL OUT_ROOT API_BANK_PER_FILE HUMANEVAL_LIMIT SPEC_BENCH_PER_CATEGORY [SPEC_BENCH_LIMIT]
#   e.g. scripts/table1.sh smollm2-135m results/table1-smollm2 4 10 1
# Each dataset is one `oilbird bench` run (its own directory under OUT_ROOT); records stream to
# disk, so a cut run still reports with `oilbird report`. One torch thread per run, so two runs
# can share a 2-core machine. Then: oilbird table OUT_ROOT/* --plot docs/table1.png
set -euo pipefail
model=$1 root=$2 per_file=$3 humaneval=$4 per_category=$5 spec_limit=${6:-100000}
oilbird=${OILBIRD:-.venv/bin/oilbird}
methods=${METHODS:-pld,sam,suffix,suffix-ref,tr,goose}
common=(--model "$model" --methods "$methods" --budget 60,auto --max-new-tokens 64 --threads 1)
mkdir -p "$root"
$oilbird bench "${common[@]}" --dataset api-bank --per-category "$per_file" --limit 100000 \
    --out "$root/api-bank" | tee "$root/api-bank.txt"
$oilbird bench "${common[@]}" --dataset humaneval --limit "$humaneval" \
    --out "$root/humaneval" | tee "$root/humaneval.txt"
$oilbird bench "${common[@]}" --dataset spec-bench --per-category "$per_category" --limit "$spec_limit" \
    --out "$root/spec-bench" | tee "$root/spec-bench.txt"
