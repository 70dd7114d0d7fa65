#!/usr/bin/env bash
# One device call: the GPU tests, compute-sanitizer (memcheck, initcheck) over
# a representative subset, then optionally the benchmark, the host-path
# profile and the kernel-config sweep; a short summary table at the end.
#
#   bash benchmarks/gpu_check.sh [--profile] [--sweep] [--bench BENCH_ARGS...]
#
# Run from anywhere on the GPU machine; logs and outputs go to $OUT (or
# ./gpu_check_out when OUT is unset). If matplotlib is missing and wheels were
# carried in .whl/, they are installed to /tmp/site for the plot.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_check_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
profile=0 sweep=0 bench_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) profile=1 ;;
    --sweep) sweep=1 ;;
    --bench) shift; bench_args=("$@"); [ ${#bench_args[@]} -eq 0 ] && bench_args=(--quick); break ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
summary=()
record() { summary+=("$(printf '%-30s %s' "$1" "$2")"); }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -m cupy_moe info > "$OUT/info.txt" 2>&1

start=$(date +%s)
python3 -m pytest -q -p no:cacheprovider tests > "$OUT/pytest.log" 2>&1
rc=$?
record "pytest tests/ (rc=$rc)" "$(tail -n 1 "$OUT/pytest.log") [$(( $(date +%s) - start ))s]"
[ $rc -ne 0 ] && grep -E '^(FAILED|ERROR)' "$OUT/pytest.log" | head -n 30

for tool in memcheck initcheck; do
  start=$(date +%s)
  compute-sanitizer --tool $tool --error-exitcode 3 python3 benchmarks/memcheck_cases.py \
    > "$OUT/sanitizer_$tool.log" 2>&1
  rc=$?
  record "compute-sanitizer $tool (rc=$rc)" \
    "$(grep -E 'ERROR SUMMARY' "$OUT/sanitizer_$tool.log" | tail -n 1 | sed 's/=* //') [$(( $(date +%s) - start ))s]"
done

if [ ${#bench_args[@]} -gt 0 ]; then
  if ! python3 -c "import matplotlib" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
      && export PYTHONPATH=$PYTHONPATH:/tmp/site
  fi
  start=$(date +%s)
  python3 -m cupy_moe bench "${bench_args[@]}" > "$OUT/bench.log" 2>&1
  rc=$?
  record "cupy-moe bench (rc=$rc)" "[$(( $(date +%s) - start ))s]"
  grep -E '^(\||roofline|cupy-moe bench|note)' "$OUT/bench.log"
fi

if [ $profile -eq 1 ]; then
  python3 benchmarks/profile_host_path.py > "$OUT/profile.log" 2>&1
  record "host-path profile (rc=$?)" ""
  cat "$OUT/profile.log"
fi

if [ $sweep -eq 1 ]; then
  start=$(date +%s)
  timeout 240 python3 benchmarks/sweep_kernel_config.py --json "$OUT/sweep.json" \
    > "$OUT/sweep.log" 2> "$OUT/sweep.err"
  record "kernel-config sweep (rc=$?)" "[$(( $(date +%s) - start ))s]"
  cat "$OUT/sweep.log"
fi

echo
echo "== gpu_check summary =="
printf '%s\n' "${summary[@]}"
