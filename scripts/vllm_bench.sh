#!/usr/bin/env bash
# The standard in-engine tables of scripts/vllm_bench.py, run one after the other (never two at
# once: they would share the CPUs). Each writes out/vllm-bench-<name>/ and out/vllm-bench-<name>.log.
#
# usage: scripts/vllm_bench.sh SUITE...      (from the project root; VENV=.venv-vllm by default)
#   smoke      4 requests, every method, max_num_seqs 1
#   slice1     the make-bench slice (20 requests), max_num_seqs 1, --threads ${THREADS:-2}
#   slice8     the same, max_num_seqs 8
#   stream1    the 100-request API-Bank stream, max_num_seqs 1
#   stream8    the same, max_num_seqs 8
#   iomp       4 requests, none/ngram/sam/oilbird-pld, without then with libiomp5 in LD_PRELOAD
# Extra arguments for every run: BENCH_ARGS="--threads 1" scripts/vllm_bench.sh slice1
set -u
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv-vllm}
THREADS=${THREADS:-2}
SUFFIX=${SUFFIX:-}
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
mkdir -p out

run() {  # name, then arguments for vllm_bench.py
    local name=$1; shift
    local dir="out/vllm-bench-$name$SUFFIX" try
    rm -f "$dir/table.md"
    # Killed runs (this machine is shared) go on where they stopped: --resume keeps finished methods.
    for try in 1 2 3 4 5; do
        echo "== $name (try $try): $*"
        "$VENV/bin/python" scripts/vllm_bench.py "$@" --threads "$THREADS" ${BENCH_ARGS:-} --resume \
            --out "$dir" >> "$dir.log" 2>&1
        echo "   rc=$? -> $dir/table.md"
        [ -f "$dir/table.md" ] && break
    done
    sed -n '/^| method/,$p' "out/vllm-bench-$name$SUFFIX/table.md" 2>/dev/null
}

for suite in "$@"; do
    case $suite in
        smoke)   run smoke --limit 4 --max-num-seqs 1 ;;
        slice1)  run slice-seqs1 --workload slice --max-num-seqs 1 ;;
        slice8)  run slice-seqs8 --workload slice --max-num-seqs 8 ;;
        stream1) run stream-seqs1 --workload stream --max-num-seqs 1 ;;
        stream8) run stream-seqs8 --workload stream --max-num-seqs 8 ;;
        iomp)    run iomp-off --limit 4 --methods none,ngram,sam,oilbird-pld
                 run iomp-on --limit 4 --methods none,ngram,sam,oilbird-pld --iomp ;;
        *) echo "unknown suite $suite" >&2; exit 2 ;;
    esac
done
