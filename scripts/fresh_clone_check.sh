#!/usr/bin/env bash
# Run a make target (default: test) on a fresh clone of this checkout's HEAD, as CI does, print
# its exit status and wall time, and delete the clone afterwards.
#
# Why a script: each clone installs two virtualenvs (about 5.5 GB with vLLM's), and clones left
# behind under /tmp filled the disk that a later CI run shared ("No space left on device" while
# installing ./.venv-vllm). The clone is removed even when the target fails or is interrupted;
# --keep leaves it for inspection.
#
# Usage: scripts/fresh_clone_check.sh [--keep] [make target or variables ...]
#   scripts/fresh_clone_check.sh                  # make test
#   scripts/fresh_clone_check.sh bench BENCH_OUT=/tmp/bench-x
set -uo pipefail

keep=0
if [[ "${1:-}" == "--keep" ]]; then keep=1; shift; fi
targets=("$@")
[[ ${#targets[@]} -eq 0 ]] && targets=(test)

repo_root=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel) || exit 2
shared="$repo_root/../shared"
[[ -d "$shared" ]] || { echo "fresh_clone_check: $shared not found (the datasets and design docs sit beside the checkout)" >&2; exit 2; }

need_gb=8
free_gb=$(df -Pk "${TMPDIR:-/tmp}" | awk 'NR==2 {print int($4 / 1048576)}')
if (( free_gb < need_gb )); then
    echo "fresh_clone_check: only ${free_gb} GB free under ${TMPDIR:-/tmp}; a clone with both environments needs about ${need_gb}. Free space first (old clones: ls -d /tmp/tmp.*/repo)." >&2
    exit 2
fi

work=$(mktemp -d)
cleanup() { if (( keep )); then echo "fresh_clone_check: clone kept in $work/repo"; else rm -rf "$work"; fi; }
trap cleanup EXIT
trap 'exit 130' INT TERM

git clone -q "$repo_root" "$work/repo" || exit 2
ln -s "$(cd "$shared" && pwd)" "$work/shared"
commit=$(git -C "$work/repo" rev-parse --short HEAD)
echo "fresh_clone_check: make ${targets[*]} at $commit in $work/repo ($(date -u +%FT%TZ))"
start=$(date +%s)
(cd "$work/repo" && make "${targets[@]}")
rc=$?
elapsed=$(( $(date +%s) - start ))
printf 'fresh_clone_check: commit %s, make %s: rc %d in %d min %02d s\n' \
    "$commit" "${targets[*]}" "$rc" $((elapsed / 60)) $((elapsed % 60))
exit $rc
