#!/usr/bin/env bash
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 170 python3 -m cupy_moe bench --op expand_to_fused_with_sf --iters 20 --json $OUT/expand_sf.json > $OUT/bench.txt 2>&1
echo "bench rc=$?"; grep -E "plan-sf|workload" $OUT/expand_sf.md | cut -c1-400 | head -20
timeout 370 python3 -m pytest -q tests/test_expand_gpu_contract.py tests/test_expand_gpu_zero_padding.py tests/test_expand_gpu_runtime.py tests/test_expand_gpu_arguments.py tests/test_layer_gpu.py -p no:cacheprovider > $OUT/tests.txt 2>&1
echo "tests rc=$?"; tail -4 $OUT/tests.txt
for tool in memcheck initcheck; do
  extra=""; [ $tool = initcheck ] && extra="--registers-only"
  timeout 40 compute-sanitizer --tool $tool python3 benchmarks/memcheck_cases.py $extra > $OUT/$tool.txt 2>&1
  echo "$tool rc=$?"; tail -2 $OUT/$tool.txt
done
