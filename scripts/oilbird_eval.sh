#!/usr/bin/env bash
# The Oilbird evaluation (docs/RESULTS.md, "Oilbird: the semantic source"): on the four API-Bank
# files served in order (one pool) and on Spec-Bench, one `oilbird bench` run each, audited token
# for token against greedy decoding, everything against autoregressive decoding in the same run:
#   - oilbird vs GOOSE and SuffixDecoding at the paper's 60 nodes, and at the hardware-aware budget;
#   - the controlled pair: oilbird vs oilbird[sem_entry_budget=0];
#   - the transplants: pld vs oilbird-pld, tr vs oilbird-tr, each at its host's unchanged budget;
#   - (API-Bank) the ablations: static-embedding key, request-level key, each component off,
#     all four components off, and no prompt records.
#
# Usage: scripts/oilbird_eval.sh MODEL OUT_ROOT SKIP API_BANK_PER_FILE SPEC_BENCH_PER_CATEGORY [WHICH]
#   e.g. scripts/oilbird_eval.sh smollm2-135m results/oilbird-smollm2 2 3 1
# SKIP: requests per file/category left out (the development split the defaults were tuned on:
# --per-category 2). WHICH: 'api-bank', 'spec-bench' or 'both' (default). One torch thread per
# run, so two runs can share a 2-core machine. Then: oilbird report OUT_ROOT/<dataset>
set -euo pipefail
model=$1 root=$2 skip=$3 per_file=$4 per_category=$5 which=${6:-both}
oilbird=${OILBIRD:-.venv/bin/oilbird}
main="goose,suffix,oilbird,oilbird[sem_entry_budget=0],pld,oilbird-pld,tr,oilbird-tr,goose@auto,suffix@auto,oilbird@auto"
ablations="oilbird[sem_layer=0],oilbird[sem_granularity=request],oilbird[sem_similarity_depth=false]"
ablations+=",oilbird[sem_floor=false],oilbird[sem_self_calibrate=false],oilbird[sem_rejected_pool=false]"
ablations+=",oilbird[sem_similarity_depth=false;sem_floor=false;sem_self_calibrate=false;sem_rejected_pool=false]"
ablations+=",oilbird[sem_index_prompt=false]"
common=(--model "$model" --budget 60 --max-new-tokens 64 --threads 1 --skip "$skip" --limit 100000)
mkdir -p "$root"
if [[ $which == both || $which == api-bank ]]; then
    $oilbird bench "${common[@]}" --methods "$main,$ablations" --dataset api-bank \
        --per-category "$per_file" --out "$root/api-bank" | tee "$root/api-bank.txt"
fi
if [[ $which == both || $which == spec-bench ]]; then
    $oilbird bench "${common[@]}" --methods "$main" --dataset spec-bench \
        --per-category "$per_category" --out "$root/spec-bench" | tee "$root/spec-bench.txt"
fi
