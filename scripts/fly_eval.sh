#!/usr/bin/env bash
# The FLy evaluation (docs/FLY.md): Qwen2.5-Coder-0.5B drafting for Qwen2.5-Coder-1.5B on GSM8K
# (Spec-Bench's 80 math_reasoning questions) and HumanEval, everything against autoregressive
# decoding of the target in the same run; strict draft-model decoding is audited token for token,
# FLy rows are LOSSY and report how many outputs differ from greedy and their accuracy recovery.
#   - strict, FLy, FLy + MLA (K = 15, θ = 0.3, W = 6), FLy with the paper's normalized entropy;
#   - (GSM8K) the ablations over W (0, 4, 6, 8), θ (0, 0.3, 0.6, 1) and K (10, 15, 20, 25);
#   - FLy on top of the training-free drafters: pld, suffix, oilbird.
#
# Usage: scripts/fly_eval.sh OUT_ROOT GSM8K_LIMIT HUMANEVAL_LIMIT [MAX_NEW_TOKENS] [THREADS]
#   e.g. scripts/fly_eval.sh results/fly 80 164 320      (the full evaluation: a GPU's job)
#        scripts/fly_eval.sh results/fly-cpu 10 10 128 2 (a CPU sample)
# Then: oilbird report OUT_ROOT/<dataset>; python scripts/fly_changes.py OUT_ROOT/<dataset>
# (docs/FLY.md's CPU sample ran these methods as four smaller runs; see the commands there.)
set -euo pipefail
root=$1 gsm8k=$2 humaneval=$3 max_new=${4:-256} threads=${5:-2}
oilbird=${OILBIRD:-.venv/bin/oilbird}
main="draft,draft+fly,draft+fly[mla=true],draft+fly[fly_entropy=normalized]"
main+=",pld,pld+fly,suffix,suffix+fly,oilbird,oilbird+fly"
ablations="draft+fly[fly_window=0],draft+fly[fly_window=4],draft+fly[fly_window=8]"
ablations+=",draft+fly[fly_theta=0],draft+fly[fly_theta=0.6],draft+fly[fly_theta=1]"
ablations+=",draft+fly[k=10],draft+fly[k=20],draft+fly[k=25]"
common=(--model qwen2.5-coder-1.5b --draft-model qwen2.5-coder-0.5b --draft-k 15 --budget 64
        --max-new-tokens "$max_new" --threads "$threads")
mkdir -p "$root"
$oilbird bench "${common[@]}" --methods "$main,$ablations" --dataset spec-bench:math_reasoning \
    --limit "$gsm8k" --out "$root/gsm8k" | tee "$root/gsm8k.txt"
$oilbird bench "${common[@]}" --methods "$main" --dataset humaneval \
    --limit "$humaneval" --out "$root/humaneval" | tee "$root/humaneval.txt"
