#!/usr/bin/env bash
# throwaway: the swiglu bench on the final files, then the whole GPU suite
export PYTHONPATH=.:$PYTHONPATH
timeout 120 python3 -m cupy_moe bench --op swiglu_quantize_fp8 --iters 20 --json $OUT/swiglu.json > $OUT/swiglu_bench.txt 2>&1; echo "bench rc $?"
bash benchmarks/gpu_check.sh > $OUT/gpu_check_stdout.txt 2>&1; echo "gpu_check rc $?"
tail -30 $OUT/swiglu_bench.txt | cut -c1-200
tail -25 $OUT/gpu_check_stdout.txt
