#!/usr/bin/env bash
# One device call for issue 13 (fifty-sixth session): the GPU tests and
# memcheck of the defaults (narrow by-position blocks since the fifty-fifth
# session, long rows since the fifty-sixth: rows of more than 8 KiB without
# scale factors at 512 <= T < 1024 take the rows kernel's token blocks of 4
# slots at 128 threads), then seed / ours in a CUDA graph on the Kimi-K2
# T = 512 plans and last session's EP8 and decode plans with the long rows
# off and laid out otherwise (sweep configs; "SF by position: all, given
# pos_to_token" is the default itself, a control column), the tightly packed
# Kimi-K2 T = 512 call (% of the copy, L2 flushed) and the probe's graph
# figures of both. ~250 s on an H100. Run from the repo root with .peers/
# carried:
#   bash benchmarks/ab_long_rows.sh   (writes under $OUT)
set -u
export OUT PYTHONPATH=$PWD PYTHONUNBUFFERED=1
source benchmarks/peer_setup.sh > $OUT/peer.log 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/summary.txt
echo "=== tests $(date +%T)" >> $OUT/checks.log
timeout 200 python3 -m pytest -q -n 12 -p no:cacheprovider tests/test_expand_gpu_*.py \
  -k "rows or public or given" >> $OUT/checks.log 2>&1
echo "rc $?" >> $OUT/checks.log
echo "=== memcheck $(date +%T)" >> $OUT/checks.log
timeout 90 compute-sanitizer --tool memcheck python3 benchmarks/memcheck_cases.py --rows-only \
  > /tmp/mc.log 2>&1
echo "rc $?" >> $OUT/checks.log; tail -3 /tmp/mc.log >> $OUT/checks.log
grep -E "passed|failed|rc |ERROR SUMMARY|memcheck cases|===" $OUT/checks.log >> $OUT/summary.txt

K="--label kimi-k2-medium-e32-ep8-plan --label kimi-k2-medium-e48-ep8-plan --label kimi-k2-medium-e128-plan --label kimi-k2-medium-e256-plan --label kimi-k2-medium-e384-plan"
Q="--label qwen3-30b-small-e48-ep8-plan --label qwen3-30b-small-e32-ep8-plan --label qwen3-30b-medium-e32-ep8-plan --label qwen3-30b-medium-e48-ep8-plan --label qwen3-30b-decode-e128-plan --label kimi-k2-decode-e384-plan-sf-row-major"
V=(--variant "SF by position: all, given pos_to_token" --variant "long rows: off, given pos_to_token"
   --variant "long rows: 256 threads, given pos_to_token" --variant "long rows: 2 slots a token block, given pos_to_token")
echo "=== seed kimi $(date +%T)" >> $OUT/seed.log
timeout 150 python3 benchmarks/bench_expand_seed.py $K --graph --rounds 3 "${V[@]}" \
  --md $OUT/seed_kimi.md --out $OUT/seed_kimi.json >> $OUT/seed.log 2>&1
echo "rc $?" >> $OUT/seed.log
echo "=== seed others $(date +%T)" >> $OUT/seed.log
timeout 100 python3 benchmarks/bench_expand_seed.py $Q --graph --rounds 3 \
  --variant "by position, rows_kernel_threads, given pos_to_token" \
  --md $OUT/seed_others.md >> $OUT/seed.log 2>&1
echo "rc $?" >> $OUT/seed.log
echo "=== sweep tight $(date +%T)" >> $OUT/sweep.log
timeout 90 python3 benchmarks/sweep_kernel_config.py --only kimi-k2-medium --rounds 3 \
  --configs "long rows: " > $OUT/sweep_tight.md 2>> $OUT/sweep.log
echo "rc $?" >> $OUT/sweep.log
echo "=== probe $(date +%T)" >> $OUT/probe.log
timeout 100 python3 benchmarks/row_block_probe.py --label kimi-k2-medium \
  --label kimi-k2-medium-e32-ep8-plan --label kimi-k2-medium-e48-ep8-plan \
  --library default --library "long rows: off, given pos_to_token" \
  --library "long rows: 256 threads, given pos_to_token" --md $OUT/probe.md >> $OUT/probe.log 2>&1
echo "rc $?" >> $OUT/probe.log
grep -E "^\| (qwen3|kimi)" $OUT/seed_kimi.md $OUT/seed_others.md | cut -c1-220 >> $OUT/summary.txt
grep -E "^\| (config|default|long rows)" $OUT/sweep_tight.md >> $OUT/summary.txt
grep -E "^\| (variant|library|rows by position: 128|roles apart: 128 thr, 1)" $OUT/probe.md >> $OUT/summary.txt
grep -E "rc " $OUT/seed.log $OUT/sweep.log $OUT/probe.log | sort | uniq -c >> $OUT/summary.txt
cat $OUT/summary.txt
