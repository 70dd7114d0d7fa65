#!/usr/bin/env bash
# The fifty-sixth session's second device call (an H200): the long rows'
# rows kernel (rows of more than 8 KiB without scale factors, 512 <= T <
# 1024, outputs below 64 MB) beside the seed on the Kimi-K2 T = 512 plans in
# a CUDA graph, off and on any output (sweep configs; "SF by position: all,
# given pos_to_token" is the default itself, a control column); the tightly
# packed Kimi-K2 T = 512 call (% of the copy, L2 flushed) on and off; and
# `cupy-moe bench` on kimi-k2-medium (the README's table). ~120 s. Run from
# the repo root with .peers/ carried:
#   bash benchmarks/ab_long_rows_h200.sh   (writes under $OUT)
set -u
export OUT PYTHONPATH=$PWD PYTHONUNBUFFERED=1
source benchmarks/peer_setup.sh > $OUT/peer.log 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/summary.txt
K="--label kimi-k2-medium-e32-ep8-plan --label kimi-k2-medium-e48-ep8-plan --label kimi-k2-medium-e128-plan --label kimi-k2-medium-e384-plan"
echo "=== seed kimi $(date +%T)" >> $OUT/seed.log
timeout 150 python3 benchmarks/bench_expand_seed.py $K --graph --rounds 3 \
  --variant "SF by position: all, given pos_to_token" --variant "long rows: off, given pos_to_token" \
  --variant "long rows: any output, given pos_to_token" \
  --md $OUT/seed_kimi.md --out $OUT/seed_kimi.json >> $OUT/seed.log 2>&1
echo "rc $?" >> $OUT/seed.log
echo "=== sweep tight $(date +%T)" >> $OUT/seed.log
timeout 90 python3 benchmarks/sweep_kernel_config.py --only kimi-k2-medium --rounds 3 \
  --configs "long rows: off" > $OUT/sweep_tight.md 2>> $OUT/seed.log
echo "rc $?" >> $OUT/seed.log
echo "=== bench $(date +%T)" >> $OUT/seed.log
timeout 90 python3 -m cupy_moe bench --op expand_to_fused --workload kimi-k2-medium \
  --workload qwen3-30b-medium --markdown $OUT/bench.md >> $OUT/seed.log 2>&1
echo "rc $?" >> $OUT/seed.log
grep -E "^\| (qwen3|kimi)" $OUT/seed_kimi.md | cut -c1-200 >> $OUT/summary.txt
grep -E "^\| (config|default|long rows)" $OUT/sweep_tight.md >> $OUT/summary.txt
grep -E "^\| (workload|kimi|qwen3)" $OUT/bench.md >> $OUT/summary.txt
grep -E "rc " $OUT/seed.log | sort | uniq -c >> $OUT/summary.txt
cat $OUT/summary.txt
