#!/usr/bin/env bash
# One device call for this parked branch (issue 13): the seed bench and the
# probe with ExpandTuning.rows_by_position_narrow_threads at 0 (every block
# rows_kernel_threads, main's behaviour) and 64 (the branch's default),
# swapped in tuning.py by sed between runs (base, 64, then 64, base), so
# that "ours" is always the default column; then the probe's split by slot
# count on the EP8 plans, the expand GPU tests and memcheck at 64. ~250 s on
# an H100. Run from the repo root with .peers/
# carried:  bash benchmarks/ab_narrow_threads.sh   (writes under $OUT)
set -u
export OUT PYTHONPATH=$PWD PYTHONUNBUFFERED=1
source benchmarks/peer_setup.sh > $OUT/peer.log 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/summary.txt
cp cupy_moe/expand/tuning.py /tmp/tuning_t64.py
grep -q "^    rows_by_position_narrow_threads: int = 64$" /tmp/tuning_t64.py || { echo "sed target missing" >> $OUT/summary.txt; exit 3; }
sed "s/^    rows_by_position_narrow_threads: int = 64$/    rows_by_position_narrow_threads: int = 0/" /tmp/tuning_t64.py > /tmp/tuning_base.py
sed "s/^    rows_by_position_narrow_threads: int = 64$/    rows_by_position_narrow_threads: int = 32/" /tmp/tuning_t64.py > /tmp/tuning_t32.py
L="--label qwen3-30b-small-e48-ep8-plan --label qwen3-30b-small-e32-ep8-plan --label qwen3-30b-medium-e32-ep8-plan --label qwen3-30b-medium-e48-ep8-plan --label qwen3-30b-decode-e128-plan --label qwen3-30b-decode-e384-plan --label kimi-k2-decode-e384-plan-sf-row-major"
P="--label qwen3-30b-decode --label qwen3-30b-small --label qwen3-30b-medium --label kimi-k2-decode-sf-row-major --label kimi-k2-medium-sf-row-major --label qwen3-30b-small-sf-row-major"
V='SF by position: all, given pos_to_token'
for r in 1 2; do
  arms="base t64"; [ $r = 2 ] && arms="t64 base"
  for k in $arms; do
    cp /tmp/tuning_$k.py cupy_moe/expand/tuning.py
    echo "=== seed $k round $r $(date +%T)" >> $OUT/seed.log
    timeout 90 python3 benchmarks/bench_expand_seed.py $L --graph --rounds 3 --md /tmp/seed.md >> $OUT/seed.log 2>&1
    echo "rc $?" >> $OUT/seed.log
    { echo "## seed bench: $k, round $r"; cat /tmp/seed.md; echo; } >> $OUT/seed_tables.md
    [ $r = 2 ] && continue
    echo "=== probe $k round $r $(date +%T)" >> $OUT/probe.log
    timeout 90 python3 benchmarks/row_block_probe.py $P --library "$V" --md /tmp/probe.md >> $OUT/probe.log 2>&1
    echo "rc $?" >> $OUT/probe.log
    { echo "## probe: $k, round $r"; cat /tmp/probe.md; echo; } >> $OUT/probe_tables.md
  done
done
cp /tmp/tuning_t64.py cupy_moe/expand/tuning.py
# the probe's split by slot count on the plans that trail the seed, and on
# the tight calls of the same shapes (where token blocks lose)
Q="--label qwen3-30b-medium-e32-ep8-plan --label kimi-k2-medium-e32-ep8-plan --label qwen3-30b-small-e48-ep8-plan --label qwen3-30b-medium --label kimi-k2-medium"
echo "=== probe EP8 $(date +%T)" >> $OUT/probe.log
timeout 120 python3 benchmarks/row_block_probe.py $Q --library "$V" --md /tmp/probe_ep.md >> $OUT/probe.log 2>&1
echo "rc $?" >> $OUT/probe.log
{ echo "## probe: EP8 plans and tight calls, t64"; cat /tmp/probe_ep.md; echo; } >> $OUT/probe_tables.md
echo "=== tests $(date +%T)" >> $OUT/checks.log
timeout 140 python3 -m pytest -q -n 12 -p no:cacheprovider tests/test_expand_gpu_*.py -k "rows or public or given" >> $OUT/checks.log 2>&1
echo "rc $?" >> $OUT/checks.log
echo "=== memcheck $(date +%T)" >> $OUT/checks.log
timeout 60 compute-sanitizer --tool memcheck python3 benchmarks/memcheck_cases.py --rows-only > /tmp/mc.log 2>&1
echo "rc $?" >> $OUT/checks.log; tail -3 /tmp/mc.log >> $OUT/checks.log
grep -E "passed|failed|rc |ERROR SUMMARY|===" $OUT/checks.log >> $OUT/summary.txt
grep -E "^## |^\| (qwen3|kimi)" $OUT/seed_tables.md | cut -d'|' -f2,5,6,7 >> $OUT/summary.txt
grep -E "^## |^\| (variant|library|rows by position: (64|256) |seed's grid: 128|roles apart: 128|split by count)" $OUT/probe_tables.md >> $OUT/summary.txt
cat $OUT/summary.txt
