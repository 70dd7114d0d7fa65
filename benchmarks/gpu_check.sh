#!/usr/bin/env bash
# One device call: the GPU tests, compute-sanitizer over a representative
# subset, then (if given) the benchmark; a short summary table at the end.
# Usage (repository root, on the GPU machine):  bash benchmarks/gpu_check.sh [bench args...]
# Logs go to $OUT (or ./gpu_check_out when OUT is unset).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_check_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
summary=()
record() { summary+=("$(printf '%-28s %s' "$1" "$2")"); }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -m cupy_moe info | tee "$OUT/info.txt"

start=$(date +%s)
python3 -m pytest -q -p no:cacheprovider tests > "$OUT/pytest.log" 2>&1
rc=$?
tail -n 3 "$OUT/pytest.log"
record "pytest (all, rc=$rc)" "$(grep -E '(passed|failed|error)' "$OUT/pytest.log" | tail -n 1) [$(( $(date +%s) - start ))s]"
if [ $rc -ne 0 ]; then grep -E '^(FAILED|ERROR)' "$OUT/pytest.log" | head -n 30; fi

for tool in memcheck initcheck; do
  start=$(date +%s)
  compute-sanitizer --tool $tool --error-exitcode 3 python3 benchmarks/memcheck_cases.py \
    > "$OUT/sanitizer_$tool.log" 2>&1
  rc=$?
  tail -n 2 "$OUT/sanitizer_$tool.log"
  record "compute-sanitizer $tool" "rc=$rc, $(grep -E 'ERROR SUMMARY' "$OUT/sanitizer_$tool.log" | tail -n 1) [$(( $(date +%s) - start ))s]"
done

if [ $# -gt 0 ]; then
  start=$(date +%s)
  python3 -m cupy_moe bench "$@" 2>&1 | tee "$OUT/bench.log"
  record "cupy-moe bench (rc=${PIPESTATUS[0]})" "[$(( $(date +%s) - start ))s]"
fi

echo
echo "== gpu_check summary =="
printf '%s\n' "${summary[@]}"
