#!/usr/bin/env bash
# One device call: the GPU tests, compute-sanitizer (memcheck, initcheck) over
# a representative subset, then optionally the benchmark, the host-path
# profile and the kernel-config sweep; a short summary table at the end.
#
#   bash benchmarks/gpu_check.sh [--skip-tests] [--tests PATHS] [--workers N] [--profile]
#                                [--sweep] [--mapping] [--floor] [--layer]
#                                [--bench BENCH_ARGS...]
#
# --tests PATHS: pytest only these test files (one word, shell globs allowed,
# e.g. 'tests/test_expand_gpu_*.py'), to split the suite over two calls when
# it nears the 10-minute limit (~480 s in the seventeenth session).
#
# --workers N: run the GPU tests (marker gpu; the CPU tests are CI's) in N
# processes (pytest-xdist, on the device image) sharing the GPU: the whole GPU
# suite then fits one call with the sanitizers (the tests are small, none
# times anything, each process has its own plans and the kernel cache's
# writes are atomic).
#
# --skip-tests: no pytest and no sanitizers (a second device call for the
# benchmarks: with every op's workloads, the tests and the full bench no longer
# fit one 10-minute call).
#
# --floor: benchmarks/mapping_floor.py, the dependency chain of a one-pass
# routing plan in skeleton kernels beside fused_mapping (issue 12's floor),
# JSON to $OUT/mapping_floor.json.
#
# --layer: `cupy-moe layer` (the end-to-end MoE layer: checked against its
# dense reference, timed per step next to torch-only equivalents) for Kimi-K2
# and Qwen3-30B-A3B at 512 tokens, both paths, to $OUT/layer.json, layer.md and
# layer.png (commit them as benchmarks/results/layer_h200.*).
#
# --mapping: benchmarks/bench_fused_mapping.py (beside TileKernels where a
# .peers/ bundle was carried: benchmarks/peer_setup.sh), JSON to
# $OUT/fused_mapping.json; then the prefill shapes' phase traces
# (profile_mapping_phases.py) into the log.
#
# Run from anywhere on the GPU machine. Outputs go to $OUT (or ./gpu_check_out
# when OUT is unset): the bench's JSON/Markdown/PNG and the sweep's JSON where
# asked for, and every log in one file, gpu_check.log (few files: the device
# tool brings back at most 8). If matplotlib is missing and wheels were
# carried in .whl/, they are installed to /tmp/site for the plot.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_check_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
skip_tests=0 profile=0 sweep=0 mapping=0 floor=0 layer=0 bench_args=() test_paths=(tests)
worker_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --skip-tests) skip_tests=1 ;;
    --tests) shift; read -r -a test_paths <<< "$(compgen -G "$1" | tr '\n' ' ')"
             [ ${#test_paths[@]} -eq 0 ] && { echo "--tests: nothing matches $1" >&2; exit 2; } ;;
    --workers) shift
               [[ "${1:-}" =~ ^[1-9][0-9]*$ ]] || { echo "--workers needs a count, got '${1:-}'" >&2; exit 2; }
               python3 -c "import xdist" 2>/dev/null \
                 || { echo "--workers needs pytest-xdist (pip install pytest-xdist)" >&2; exit 2; }
               worker_args=(-n "$1") ;;
    --profile) profile=1 ;;
    --sweep) sweep=1 ;;
    --mapping) mapping=1 ;;
    --floor) floor=1 ;;
    --layer) layer=1 ;;
    --bench) shift; bench_args=("$@"); [ ${#bench_args[@]} -eq 0 ] && bench_args=(--quick); break ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
LOG=$OUT/gpu_check.log
: > "$LOG"
section() { printf '\n===== %s =====\n' "$1" >> "$LOG"; }
summary=()
record() { summary+=("$(printf '%-30s %s' "$1" "$2")"); }

section info
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$LOG"
python3 -m cupy_moe info >> "$LOG" 2>&1

if [ $skip_tests -eq 0 ]; then
start=$(date +%s)
# --durations: the slowest tests in the log (the suite took ~480 s of a 600 s call
# in the seventeenth session; trim from the top of this list)
# (with --workers, the tests marked big_memory run alone afterwards: the layer
# tests' Kimi-K2 weights are 10.5 GiB a process, and eight workers at once ran an
# 80 GB H100 out of memory)
gpu_marker=(); [ ${#worker_args[@]} -gt 0 ] && gpu_marker=(-m "gpu and not big_memory")
python3 -m pytest -q -p no:cacheprovider --durations=25 "${worker_args[@]}" \
  ${gpu_marker[@]+"${gpu_marker[@]}"} "${test_paths[@]}" > "$OUT/pytest.tmp" 2>&1
rc=$?
[ ${#worker_args[@]} -gt 0 ] && [ $rc -eq 5 ] && rc=0  # (every test selected was big_memory)
record "pytest ${#test_paths[@]} path(s) (rc=$rc)" "$(tail -n 1 "$OUT/pytest.tmp") [$(( $(date +%s) - start ))s]"
[ $rc -ne 0 ] && grep -E '^(FAILED|ERROR)' "$OUT/pytest.tmp" | head -n 30
section pytest; cat "$OUT/pytest.tmp" >> "$LOG"; rm -f "$OUT/pytest.tmp"
if [ ${#worker_args[@]} -gt 0 ]; then
  start=$(date +%s)
  python3 -m pytest -q -p no:cacheprovider -m "gpu and big_memory" "${test_paths[@]}" \
    > "$OUT/pytest.tmp" 2>&1
  rc=$?
  if [ $rc -ne 5 ]; then  # 5: none of the paths holds a big_memory test
    record "pytest big_memory, alone (rc=$rc)" "$(tail -n 1 "$OUT/pytest.tmp") [$(( $(date +%s) - start ))s]"
    [ $rc -ne 0 ] && grep -E '^(FAILED|ERROR)' "$OUT/pytest.tmp" | head -n 30
  fi
  section "pytest big_memory"; cat "$OUT/pytest.tmp" >> "$LOG"; rm -f "$OUT/pytest.tmp"
fi

# initcheck does not see the bulk-copy engine's writes (memcheck_cases.py says more)
for tool in memcheck initcheck; do
  start=$(date +%s)
  case_args=()
  [ $tool = initcheck ] && case_args=(--registers-only)
  compute-sanitizer --tool $tool --error-exitcode 3 python3 benchmarks/memcheck_cases.py \
    "${case_args[@]}" > "$OUT/sanitizer.tmp" 2>&1
  rc=$?
  record "compute-sanitizer $tool (rc=$rc)" \
    "$(grep -E 'ERROR SUMMARY' "$OUT/sanitizer.tmp" | tail -n 1 | sed 's/=* //') [$(( $(date +%s) - start ))s]"
  section "compute-sanitizer $tool"; cat "$OUT/sanitizer.tmp" >> "$LOG"; rm -f "$OUT/sanitizer.tmp"
done
fi

if { [ ${#bench_args[@]} -gt 0 ] || [ $layer -eq 1 ]; } \
    && ! python3 -c "import matplotlib" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi

if [ ${#bench_args[@]} -gt 0 ]; then
  start=$(date +%s)
  section "cupy-moe bench ${bench_args[*]}"
  python3 -m cupy_moe bench "${bench_args[@]}" >> "$LOG" 2>&1
  rc=$?
  record "cupy-moe bench (rc=$rc)" "[$(( $(date +%s) - start ))s]"
  grep -E '^(\||roofline|cupy-moe bench|note)' "$LOG"
fi

if [ $mapping -eq 1 ]; then
  start=$(date +%s)
  section "fused_mapping bench"
  ( source benchmarks/peer_setup.sh >> "$LOG" 2>&1
    timeout 300 python3 benchmarks/bench_fused_mapping.py --json "$OUT/fused_mapping.json" \
      > "$OUT/mapping.tmp" 2>> "$LOG" )
  record "fused_mapping bench (rc=$?)" "[$(( $(date +%s) - start ))s]"
  cat "$OUT/mapping.tmp" | tee -a "$LOG"; rm -f "$OUT/mapping.tmp"
  # phase traces of the prefill shapes, the default kernel
  start=$(date +%s)
  section "fused_mapping phases"
  shapes="4096 8 128 128 4096 8 256 128 4096 8 384 128 8192 8 384 128"
  python3 benchmarks/profile_mapping_phases.py $shapes >> "$LOG" 2>&1
  record "fused_mapping phases (rc=$?)" "[$(( $(date +%s) - start ))s]"
fi

if [ $floor -eq 1 ]; then
  start=$(date +%s)
  section "fused_mapping floor"
  timeout 120 python3 benchmarks/mapping_floor.py --json "$OUT/mapping_floor.json" \
    > "$OUT/floor.tmp" 2>> "$LOG"
  record "mapping floor (rc=$?)" "[$(( $(date +%s) - start ))s]"
  cat "$OUT/floor.tmp" | tee -a "$LOG"; rm -f "$OUT/floor.tmp"
fi

if [ $layer -eq 1 ]; then
  start=$(date +%s)
  section "cupy-moe layer"
  plot_args=()
  python3 -c "import matplotlib" 2>/dev/null && plot_args=(--plot "$OUT/layer.png")
  timeout 540 python3 -m cupy_moe layer --model kimi-k2 --model qwen3-30b-a3b --tokens 512 \
    --path both --json "$OUT/layer.json" "${plot_args[@]}" > "$OUT/layer.tmp" 2>> "$LOG"
  record "cupy-moe layer (rc=$?)" "[$(( $(date +%s) - start ))s]"
  cat "$OUT/layer.tmp" | tee -a "$LOG"; rm -f "$OUT/layer.tmp"
fi

if [ $profile -eq 1 ]; then
  section "host-path profile"
  python3 benchmarks/profile_host_path.py >> "$LOG" 2>&1
  record "host-path profile (rc=$?)" ""
  sed -n '/===== host-path profile/,$p' "$LOG" | tail -n +2
fi

if [ $sweep -eq 1 ]; then
  start=$(date +%s)
  section "kernel-config sweep"
  timeout 240 python3 benchmarks/sweep_kernel_config.py --json "$OUT/sweep.json" \
    > "$OUT/sweep.tmp" 2>> "$LOG"
  record "kernel-config sweep (rc=$?)" "[$(( $(date +%s) - start ))s]"
  cat "$OUT/sweep.tmp" | tee -a "$LOG"; rm -f "$OUT/sweep.tmp"
fi

echo
echo "== gpu_check summary =="
printf '%s\n' "${summary[@]}"
