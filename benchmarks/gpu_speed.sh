#!/usr/bin/env bash
# One device call for speed work (after gpu_check.sh has passed): the
# reduce_fused launch-shape sweep, ncu profiles of chosen workloads, and the
# expand config sweep on decode plans; every log to $OUT/gpu_speed.log and a
# short summary at the end.
#
#   bash benchmarks/gpu_speed.sh [--combine] [--combine-ep] [--swiglu] [--expand-decode]
#                                [--padding] [--compiled-row] [--zero-runs] [--seed]
#                                [--mapping-clusters]
#                                [--ncu LABEL KERNEL_REGEX]...
#                                [--ncu-combine LABEL "NAME=VALUE ..."]...
#                                [--ncu-seed LABEL]...
#
# --combine: benchmarks/sweep_combine.py (vectors a thread, slot batch, warps).
# --combine-ep: reduce_fused on the DeepSeek-V3 EP8 prefill plans (issue 14;
#   trimmed, and untrimmed: fused_mapping's default X): the GPU tests of the
#   expert-parallel and bulk layouts, sweep_combine.py's bulk and streamed
#   shapes with the gather floor (beside Kimi-K2 and Qwen3 prefill), and the
#   bench records of the four plans, JSON to $OUT/reduce_ep.json.
# --swiglu: benchmarks/sweep_swiglu.py (block size, the *_rows register budget).
# --expand-decode: benchmarks/sweep_kernel_config.py on the decode plans
#   (graph-replay µs per config).
# --padding: benchmarks/sweep_kernel_config.py on the padding-heavy plans the
#   seed's kernel beats (results/expand_seed_h200.md), JSON to
#   $OUT/sweep_padding.json.
# --compiled-row: issue 13's register kernel compiled for the row
#   (ExpandTuning.compiled_row 1, and 2: only where a thread holds one access)
#   on the Qwen3 plans, JSON to $OUT/sweep_compiled_row.json; then the expand
#   GPU tests of the compiled-row kernel path for up to 200 s.
# --zero-runs: issue 13's zero-fill blocks by runs of rows
#   (ExpandTuning.zero_fill_runs) on the Qwen3 plans and the Kimi-K2 plans the
#   register kernel takes, JSON to $OUT/sweep_zero_runs.json; then the expand
#   GPU tests of the zero-runs kernel path for up to 200 s.
# --mapping-clusters: issue 12's cooperative mapping kernel in clusters
#   (MappingShape.cluster_blocks): the mapping GPU tests of clusters and of
#   every launch shape, compute-sanitizer memcheck over the cluster tests,
#   phase traces of the prefill shapes plain and in clusters of 2, 4 and 8,
#   and bench_fused_mapping.py --clusters on the medium and prefill shapes
#   (cooperative grids of 16-128 blocks, plain and in clusters, beside the
#   default and TileKernels where .peers/ is carried), JSON to
#   $OUT/mapping_clusters.json.
# --seed: benchmarks/bench_expand_seed.py (the seed's TileLang kernel beside
#   ours on every plan workload; needs the .peers/ bundle carried and
#   .peers/seed/ holding the PR text), JSON and Markdown to $OUT/seed.*.
# --ncu LABEL REGEX: ncu --set full on the 3rd launch matching REGEX of
#   benchmarks/profile_op.py LABEL, summarised by ncu_top_sass.py.
# --ncu-combine LABEL SHAPE: the same for a reduce_fused workload under the
#   launch shape SHAPE (profile_op.py --combine-shape), e.g.
#   --ncu-combine reduce-dsv3-ep8-prefill-plan "vecs_per_thread=2 max_warps=4 bulk_stages=4".
# --ncu-seed LABEL: the same for an expand plan workload, twice: the seed's
#   TileLang kernel (benchmarks/profile_seed.py; needs the .peers/ bundle
#   carried) and ours (profile_op.py), with each report's details page whole
#   in the log, so that the two can be read side by side.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_speed_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
LOG=$OUT/gpu_speed.log
: > "$LOG"
summary=()
section() { printf '\n===== %s =====\n' "$1" | tee -a "$LOG"; }
# the expand GPU tests of one conftest kernel path (KERNEL_PATHS), for up to 200 s
kernel_path_tests() {
  local start=$(date +%s)
  section "expand GPU tests, the $1 kernel path"
  timeout 200 python3 -m pytest -q -p no:cacheprovider -k "$1" \
    tests/test_expand_gpu_contract.py tests/test_expand_gpu_zero_padding.py >> "$LOG" 2>&1
  summary+=("expand $1 tests rc=$? $(grep -E '^[0-9]+ (passed|failed)' "$LOG" \
            | tail -1) [$(( $(date +%s) - start ))s]")
}
combine=0 combine_ep=0 swiglu=0 expand_decode=0 padding=0 compiled_row=0 zero_runs=0 seed=0
mapping_clusters=0 profiles=() seed_profiles=()
while [ $# -gt 0 ]; do
  case "$1" in
    --combine) combine=1 ;;
    --combine-ep) combine_ep=1 ;;
    --swiglu) swiglu=1 ;;
    --expand-decode) expand_decode=1 ;;
    --padding) padding=1 ;;
    --compiled-row) compiled_row=1 ;;
    --zero-runs) zero_runs=1 ;;
    --seed) seed=1 ;;
    --mapping-clusters) mapping_clusters=1 ;;
    --ncu) profiles+=("$2|$3|"); shift 2 ;;
    --ncu-combine) profiles+=("$2|reduce_fused|$3"); shift 2 ;;
    --ncu-seed) seed_profiles+=("$2"); shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

if [ $combine -eq 1 ]; then
  start=$(date +%s)
  section "reduce_fused launch-shape sweep"
  timeout 240 python3 benchmarks/sweep_combine.py 2>> "$LOG" | tee -a "$LOG"
  summary+=("sweep_combine rc=${PIPESTATUS[0]} [$(( $(date +%s) - start ))s]")
fi

if [ $mapping_clusters -eq 1 ]; then
  start=$(date +%s)
  section "fused_mapping in clusters: GPU tests"
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_mapping_gpu.py \
    -k "clusters or every_launch_shape" >> "$LOG" 2>&1
  summary+=("mapping cluster tests rc=$? $(grep -E '^[0-9]+ (passed|failed)' "$LOG" | tail -1)")
  section "fused_mapping in clusters: memcheck"
  timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q \
    -p no:cacheprovider tests/test_mapping_gpu.py -k clusters >> "$LOG" 2>&1
  summary+=("mapping cluster memcheck rc=$? (9: errors)")
  section "fused_mapping in clusters: phase traces"
  prefill="4096 8 128 128 4096 8 256 128 4096 8 384 128 8192 8 384 128"
  for cluster in 0 2 4 8; do
    args=()
    [ $cluster -gt 0 ] && args=(--cluster $cluster)
    timeout 60 python3 benchmarks/profile_mapping_phases.py ${args[@]+"${args[@]}"} $prefill \
      2>&1 | tee -a "$LOG"
  done
  section "fused_mapping in clusters: graph us per call"
  ( [ -d .peers ] && source benchmarks/peer_setup.sh >> "$LOG" 2>&1
    timeout 200 python3 benchmarks/bench_fused_mapping.py --iters 30 --clusters \
      --only medium prefill-e128 prefill-e256 prefill-e384 prefill-8k-e384 \
      --json "$OUT/mapping_clusters.json" 2>> "$LOG" | tee -a "$LOG"; exit "${PIPESTATUS[0]}" )
  summary+=("bench_fused_mapping clusters rc=$? [$(( $(date +%s) - start ))s]")
fi

if [ $combine_ep -eq 1 ]; then
  start=$(date +%s)
  section "reduce_fused on expert-parallel plans: GPU tests"
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_combine_gpu.py \
    -k "bulk or expert_parallel or offsets" >> "$LOG" 2>&1
  summary+=("combine EP tests rc=$? $(grep -E '^[0-9]+ (passed|failed)' "$LOG" | tail -1)")
  section "reduce_fused on expert-parallel plans: shapes and the gather floor"
  ep_plans=(reduce-dsv3-ep8-prefill-plan reduce-dsv3-ep8-prefill-8k-plan
            reduce-dsv3-ep8-prefill-plan-untrimmed reduce-dsv3-ep8-prefill-8k-plan-untrimmed)
  timeout 200 python3 benchmarks/sweep_combine.py --floor --only "${ep_plans[@]}" \
    reduce-kimi-k2-prefill reduce-qwen3-30b-a3b-prefill \
    --shapes bulk_stages "max_warps=4, stream_rounds=1" 2>> "$LOG" | tee -a "$LOG"
  summary+=("sweep_combine EP rc=${PIPESTATUS[0]}")
  section "reduce_fused on expert-parallel plans: bench records"
  timeout 150 python3 -m cupy_moe bench --op reduce_fused --iters 20 \
    $(printf -- '--workload %s ' "${ep_plans[@]}") --json "$OUT/reduce_ep.json" \
    2>&1 | tee -a "$LOG"
  summary+=("bench reduce EP rc=${PIPESTATUS[0]} [$(( $(date +%s) - start ))s]")
fi

if [ $swiglu -eq 1 ]; then
  start=$(date +%s)
  section "swiglu_quantize_fp8 tuning sweep"
  timeout 240 python3 benchmarks/sweep_swiglu.py 2>> "$LOG" | tee -a "$LOG"
  summary+=("sweep_swiglu rc=${PIPESTATUS[0]} [$(( $(date +%s) - start ))s]")
fi

for entry in "${profiles[@]}"; do
  IFS='|' read -r label regex shape <<< "$entry"
  shape_args=()
  [ -n "$shape" ] && read -r -a shape_args <<< "--combine-shape $shape"
  start=$(date +%s)
  section "ncu $label ($regex${shape:+, $shape})"
  timeout 180 ncu --set full --import-source no --kernel-name "regex:$regex" --launch-skip 2 \
    --launch-count 1 -f -o "$OUT/$label" python3 benchmarks/profile_op.py "$label" \
    ${shape_args[@]+"${shape_args[@]}"} >> "$LOG" 2>&1
  rc=$?
  python3 benchmarks/ncu_top_sass.py "$OUT/$label.ncu-rep" 20 2>&1 | tee -a "$LOG"
  rm -f "$OUT/$label.ncu-rep"
  summary+=("ncu $label rc=$rc [$(( $(date +%s) - start ))s]")
done

for label in "${seed_profiles[@]}"; do
  for side in seed ours; do
    start=$(date +%s)
    section "ncu $label, $side"
    if [ $side = seed ]; then
      driver=(bash -c 'source benchmarks/peer_setup.sh >/dev/null && exec python3 benchmarks/profile_seed.py "$0"' "$label")
    else
      driver=(python3 benchmarks/profile_op.py "$label")
    fi
    timeout 240 ncu --set full --import-source no --kernel-name "regex:expand_to_fused" \
      --launch-skip 2 --launch-count 1 -f -o "$OUT/$label-$side" "${driver[@]}" >> "$LOG" 2>&1
    rc=$?
    ncu --import "$OUT/$label-$side.ncu-rep" --page details >> "$LOG" 2>&1
    python3 benchmarks/ncu_top_sass.py "$OUT/$label-$side.ncu-rep" 20 2>&1 | tee -a "$LOG"
    rm -f "$OUT/$label-$side.ncu-rep"
    summary+=("ncu $label $side rc=$rc [$(( $(date +%s) - start ))s]")
  done
done

if [ $expand_decode -eq 1 ]; then
  start=$(date +%s)
  section "expand config sweep, decode plans"
  timeout 180 python3 benchmarks/sweep_kernel_config.py --plans --rounds 5 --only \
    kimi-k2-decode-e384-plan qwen3-30b-decode-e128-plan kimi-k2-decode-e384-plan-sf-packed \
    2>> "$LOG" | tee -a "$LOG"
  summary+=("sweep_kernel_config decode rc=${PIPESTATUS[0]} [$(( $(date +%s) - start ))s]")
fi

if [ $padding -eq 1 ]; then
  start=$(date +%s)
  section "expand config sweep, padding-heavy plans"
  timeout 240 python3 benchmarks/sweep_kernel_config.py --plans --rounds 2 \
    --json "$OUT/sweep_padding.json" --only kimi-k2-small-e128-plan kimi-k2-small-e384-plan \
    kimi-k2-small-e48-ep8-plan kimi-k2-medium-e48-ep8-plan qwen3-30b-small-e128-plan \
    qwen3-30b-medium-e32-ep8-plan kimi-k2-small-e256-plan-sf-packed \
    qwen3-30b-medium-e128-plan-sf-row-major 2>> "$LOG" | tee -a "$LOG"
  summary+=("sweep_kernel_config padding rc=${PIPESTATUS[0]} [$(( $(date +%s) - start ))s]")
fi

if [ $compiled_row -eq 1 ]; then
  start=$(date +%s)
  section "expand: the register kernel compiled for the row, Qwen3 plans"
  timeout 200 python3 benchmarks/sweep_kernel_config.py --plans --rounds 2 \
    --json "$OUT/sweep_compiled_row.json" --configs "compiled for" --only \
    qwen3-30b-decode-e128-plan qwen3-30b-small-e128-plan qwen3-30b-medium-e128-plan \
    qwen3-30b-prefill-e128-plan qwen3-30b-small-e128-plan-sf-row-major \
    qwen3-30b-medium-e128-plan-sf-row-major qwen3-30b-medium-e128-plan-sf-packed \
    2>> "$LOG" | tee -a "$LOG"
  summary+=("sweep_kernel_config compiled row rc=${PIPESTATUS[0]} [$(( $(date +%s) - start ))s]")
  kernel_path_tests compiled-row
fi

if [ $zero_runs -eq 1 ]; then
  start=$(date +%s)
  section "expand: zero-fill blocks by runs of rows"
  timeout 240 python3 benchmarks/sweep_kernel_config.py --plans --rounds 2 \
    --json "$OUT/sweep_zero_runs.json" --configs "zero-fill row by row" "zero-fill by runs" \
    "compiled for rows of one" "blocks an SM" \
    --only qwen3-30b-decode-e128-plan qwen3-30b-small-e128-plan qwen3-30b-medium-e128-plan \
    qwen3-30b-small-e128-plan-sf-row-major qwen3-30b-medium-e128-plan-sf-row-major \
    qwen3-30b-medium-e128-plan-sf-packed qwen3-30b-medium-e48-ep8-plan \
    kimi-k2-small-e128-plan kimi-k2-medium-e128-plan kimi-k2-medium-e48-ep8-plan \
    2>> "$LOG" | tee -a "$LOG"
  summary+=("sweep_kernel_config zero runs rc=${PIPESTATUS[0]} [$(( $(date +%s) - start ))s]")
  kernel_path_tests zero-runs
fi

if [ $seed -eq 1 ]; then
  start=$(date +%s)
  section "expand beside the seed's TileLang kernel"
  ( source benchmarks/peer_setup.sh >> "$LOG" 2>&1
    timeout 200 python3 benchmarks/bench_expand_seed.py --max-seconds 150 \
      --out "$OUT/seed.json" --md "$OUT/seed.md" >> "$LOG" 2>&1 )
  summary+=("bench_expand_seed rc=$? [$(( $(date +%s) - start ))s]")
  [ -f "$OUT/seed.md" ] && grep '^| ' "$OUT/seed.md"
fi

echo
echo "== gpu_speed summary =="
printf '%s\n' "${summary[@]}"
