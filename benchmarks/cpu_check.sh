#!/usr/bin/env bash
# The GPU test suites with their kernels run on the CPU (tests/cuda_on_cpu:
# each CUDA thread a fiber), one pytest process a suite, a short table at the
# end: what a session without a device runs after changing a kernel; then
# memcheck_cases.py (the sanitizers' subset of calls) the same way.
#
#   bash benchmarks/cpu_check.sh [TEST_FILES...]      (default: every tests/test_*gpu*.py)
#
# Needs a C++ compiler on x86-64. Streams, graphs, torch's CUDA tensors and
# the tests' own raw-kernel self-tests skip (README: "Without a GPU the
# kernels themselves still run"). Logs to ${OUT:-./cpu_check_out}/cpu_check.log.
set -u
cd "$(dirname "$0")/.."
# this tree's package, whatever else is installed (memcheck_cases.py runs as a script)
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-$PWD/cpu_check_out}
mkdir -p "$OUT"
log=$OUT/cpu_check.log
: > "$log"
files=("$@")
[ ${#files[@]} -gt 0 ] || files=(tests/test_*gpu*.py)
rows=()
status=0
for file in "${files[@]}"; do
  start=$(date +%s)
  PYTHONPATH=tests${PYTHONPATH:+:$PYTHONPATH} python3 -m pytest -p cuda_on_cpu.plugin \
    -p no:cacheprovider -q -k "not torch" "$file" > "$OUT/last.log" 2>&1
  rc=$?
  cat "$OUT/last.log" >> "$log"
  [ $rc -eq 0 ] || [ $rc -eq 5 ] || status=1
  summary=$(grep -E "^[0-9]+ (passed|failed|skipped|deselected)|no tests ran|^Fatal Python" \
            "$OUT/last.log" | tail -1)
  rows+=("$(printf '%-42s %4ss  rc %d  %s' "$(basename "$file")" "$(( $(date +%s) - start ))" \
            "$rc" "$summary")")
done
# the sanitizers' subset of calls (memcheck_cases.py), checked bit-exact and
# for writes outside the outputs: the script's own dry run before device time
start=$(date +%s)
python3 tests/cuda_on_cpu/run_script.py benchmarks/memcheck_cases.py >> "$log" 2>&1
rc=$?
[ $rc -eq 0 ] || status=1
rows+=("$(printf '%-42s %4ss  rc %d  %s' "memcheck_cases.py" "$(( $(date +%s) - start ))" "$rc" \
          "$(grep -E "^memcheck cases:" "$log" | tail -1)")")
echo
echo "GPU suites on the CPU (log: $log)"
printf '%s\n' "${rows[@]}"
exit $status
