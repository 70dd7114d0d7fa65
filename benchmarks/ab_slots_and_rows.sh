#!/usr/bin/env bash
# Issue 13, fifty-sixth session: the probe's slots-and-rows-merged kernel
# (max(T*K, X) blocks, block b slot b's copy and row b's zero-fill, its map
# words and token row loaded in one round trip) beside the probe's other
# layouts and the library's default, on three EP8 plans and the tightly
# packed calls of the same shapes (CUDA graph); and the seed on the
# plans in the same call. ~100 s on an H100. Run from the repo root with
# .peers/ carried:
#   bash benchmarks/ab_slots_and_rows.sh   (writes under $OUT)
set -u
export OUT PYTHONPATH=$PWD PYTHONUNBUFFERED=1
source benchmarks/peer_setup.sh > $OUT/peer.log 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/summary.txt
P="--label qwen3-30b-small-e48-ep8-plan --label qwen3-30b-medium-e32-ep8-plan --label kimi-k2-medium-e32-ep8-plan"
echo "=== probe $(date +%T)" >> $OUT/probe.log
timeout 150 python3 benchmarks/row_block_probe.py $P --label qwen3-30b-small \
  --label qwen3-30b-medium --label kimi-k2-medium \
  --library default --md $OUT/probe.md --json $OUT/probe.json >> $OUT/probe.log 2>&1
echo "rc $?" >> $OUT/probe.log
echo "=== seed $(date +%T)" >> $OUT/seed.log
timeout 80 python3 benchmarks/bench_expand_seed.py $P --graph --rounds 2 \
  --md $OUT/seed.md >> $OUT/seed.log 2>&1
echo "rc $?" >> $OUT/seed.log
grep -E "^\| (variant|memset|seed's grid: 128|roles apart: 128 thr, 1|rows by position|slots and rows|library)" $OUT/probe.md >> $OUT/summary.txt
grep -E "^\| (qwen3|kimi)" $OUT/seed.md | cut -d'|' -f2,5,6,7 >> $OUT/summary.txt
grep -E "rc " $OUT/seed.log $OUT/probe.log >> $OUT/summary.txt
cat $OUT/summary.txt
