#!/usr/bin/env bash
# Build the uncommitted .peers/ bundle that benchmarks/peer_setup.sh unpacks on
# the device (which has no network): the side-by-side runs time DeepSeek
# TileKernels' get_fused_mapping and the seed's TileLang expand kernel in the
# same process as ours. Run on a machine with a package index; the device's
# Python is 3.12 and has torch, numpy and ml_dtypes already, so they are left
# out (the carried paths may hold 64 MiB in all; this is ~48 MB).
#
#   bash benchmarks/peer_bundle.sh [SEED_DIFF]
#
# Writes:
#   .peers/tilelang_site.tar.xz   tilelang 0.1.15 and its remaining dependencies
#                                 (pip --target tree, CPython 3.12 manylinux wheels)
#   .peers/seed/expand_to_fused_pr.diff.txt   the seed's PR text (default
#                                 ../shared/seed/expand_to_fused_pr.diff.txt)
# Not written here: .peers/tile_kernels/, the TileKernels sources the mapping
# comparison imports (tile_kernels/moe/get_fused_mapping_kernel.py of
# deepseek-ai/TileKernels at 1001fca, tile_kernels/utils.py, and a config
# module with get_num_sms(); empty __init__.py files), and the reduce_fused
# comparison (bench_combine_quantize.py, profile_op.py --tilekernels):
# tile_kernels/moe/reduce_fused_kernel.py at a06642d, with stand-ins for
# quant/common.py and quant/types.py that give it QuantTensor (= tuple) alone;
# since the thirty-fourth session quant/common.py is TileKernels' own (at
# 251c38f) and quant/per_token_cast_kernel.py (at e5ecceb, its e5m6 import a
# stub) serves the quantize_fp8 comparison; since the thirty-sixth session
# quant/swiglu_forward_and_per_token_cast_kernel.py (TileKernels' file as the
# search tool's code corpus returned it, which does not name its commit) the
# swiglu_quantize_fp8 one, its unused clamp counters allocated only where
# they are finalized (tilelang 0.1.15 rejects an unfinalized reducer; the
# kernel's arithmetic is untouched).
# They are public code that stays out of this repository: fetch them by hand.
set -euo pipefail
cd "$(dirname "$0")/.."
seed_diff=${1:-../shared/seed/expand_to_fused_pr.diff.txt}
python=${PYTHON:-python3}
build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT

"$python" -m pip install -q --no-deps --target "$build/site" --python-version 3.12 \
  --only-binary=:all: --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 \
  "tilelang==0.1.15" "apache-tvm-ffi==0.1.12" cloudpickle psutil tqdm \
  "z3-solver>=4.13.0,<4.15.5"
mkdir -p .peers/seed
tar -C "$build/site" -cf - . | xz -T0 -9 > .peers/tilelang_site.tar.xz
cp "$seed_diff" .peers/seed/expand_to_fused_pr.diff.txt
du -sh .peers/tilelang_site.tar.xz .peers/seed
[ -d .peers/tile_kernels ] || echo "peer_bundle: .peers/tile_kernels/ is missing (see above)"
