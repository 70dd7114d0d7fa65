#!/usr/bin/env bash
# One device call for issue 13's narrow by-position blocks: the seed bench on
# the EP8 and decode plans with ExpandTuning.rows_by_position_narrow_threads
# at 0 (every block rows_kernel_threads) and 64 (the default since the
# fifty-fifth session: rows of at most 8 KiB without scale factors), swapped
# in tuning.py by sed between runs (0, 64, 64, 0), so that "ours" is always
# the default column; the probe's library rows under both on the tightly
# packed calls of those shapes (and the default's own column, a control);
# then the expand GPU tests and memcheck at the default (64). ~150 s on an
# H100. Run from the repo root with .peers/ carried:
#   bash benchmarks/ab_narrow_threads.sh   (writes under $OUT)
set -u
export OUT PYTHONPATH=$PWD PYTHONUNBUFFERED=1
source benchmarks/peer_setup.sh > $OUT/peer.log 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/summary.txt
T=cupy_moe/expand/tuning.py
N="    rows_by_position_narrow_threads: int = "
grep -q "^${N}64$" $T || { echo "sed target missing" >> $OUT/summary.txt; exit 3; }
cp $T /tmp/tuning_orig.py
L="--label qwen3-30b-small-e48-ep8-plan --label qwen3-30b-small-e32-ep8-plan --label qwen3-30b-medium-e32-ep8-plan --label qwen3-30b-medium-e48-ep8-plan --label kimi-k2-medium-e32-ep8-plan --label qwen3-30b-decode-e128-plan --label qwen3-30b-decode-e384-plan --label kimi-k2-decode-e384-plan-sf-row-major"
for a in 0 64 64 0; do
  sed "s/^${N}64$/${N}$a/" /tmp/tuning_orig.py > $T
  echo "=== seed narrow $a $(date +%T)" >> $OUT/seed.log
  timeout 100 python3 benchmarks/bench_expand_seed.py $L --graph --rounds 3 --md /tmp/seed.md >> $OUT/seed.log 2>&1
  echo "rc $?" >> $OUT/seed.log
  { echo "## seed bench: narrow $a"; cat /tmp/seed.md; echo; } >> $OUT/seed_tables.md
done
cp /tmp/tuning_orig.py $T
P="--label qwen3-30b-small --label qwen3-30b-medium --label qwen3-30b-decode --label kimi-k2-decode-sf-row-major --label kimi-k2-medium-sf-row-major --label qwen3-30b-small-e48-ep8-plan"
G="given pos_to_token"
echo "=== probe $(date +%T)" >> $OUT/probe.log
timeout 150 python3 benchmarks/row_block_probe.py $P --library "by position, rows_kernel_threads, $G" --library "by position, 64 threads to 8 KiB rows, $G" --library "SF by position: all, $G" --md $OUT/probe.md >> $OUT/probe.log 2>&1
echo "rc $?" >> $OUT/probe.log
echo "=== tests $(date +%T)" >> $OUT/checks.log
timeout 150 python3 -m pytest -q -n 12 -p no:cacheprovider tests/test_expand_gpu_*.py -k "rows or public or given" >> $OUT/checks.log 2>&1
echo "rc $?" >> $OUT/checks.log
echo "=== memcheck $(date +%T)" >> $OUT/checks.log
timeout 90 compute-sanitizer --tool memcheck python3 benchmarks/memcheck_cases.py --rows-only > /tmp/mc.log 2>&1
echo "rc $?" >> $OUT/checks.log; tail -3 /tmp/mc.log >> $OUT/checks.log
grep -E "passed|failed|rc |ERROR SUMMARY|memcheck cases|===" $OUT/checks.log >> $OUT/summary.txt
grep -E "^## |^\| (qwen3|kimi)" $OUT/seed_tables.md | cut -d'|' -f2,5,6,7 >> $OUT/summary.txt
grep -E "^\| (variant|library|rows by position: (64|256) )" $OUT/probe.md >> $OUT/summary.txt
grep -E "rc " $OUT/seed.log $OUT/probe.log | sort | uniq -c >> $OUT/summary.txt
cat $OUT/summary.txt
