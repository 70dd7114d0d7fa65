#!/usr/bin/env bash
# Optional peer setup for side-by-side timing against DeepSeek TileKernels'
# get_fused_mapping (a TileLang kernel). The peer code is never committed: a
# session may carry an untracked .peers/ folder holding
#   .peers/tilelang_site.tar.xz  tilelang + its Python deps (pip --target tree)
#   .peers/tile_kernels/         the few TileKernels sources the kernel needs
# The seed's bench needs the tilelang bundle alone; TileKernels' comparison
# needs tile_kernels/ too (PEER_TILEKERNELS says whether it is there).
# This script extracts the bundle once to $PEER_SITE (default /tmp/peer_site),
# prepends it and .peers to PYTHONPATH, and sets CUDA_HOME (default
# /usr/local/cuda) and a TileLang cache under /tmp. Without the bundle it says
# so (on stderr, so that the export lines can be eval'd) and returns 0,
# changing nothing.
#
#   source benchmarks/peer_setup.sh   # sets the variables in this shell
#   bash benchmarks/peer_setup.sh     # prints the export lines instead

_peer_setup() {
  local root bundle site stamp sum
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  bundle=$root/.peers/tilelang_site.tar.xz
  site=${PEER_SITE:-/tmp/peer_site}
  if [ ! -f "$bundle" ]; then
    echo "peer_setup: no peer bundle in $root/.peers; peer comparisons skipped" >&2
    return 0
  fi
  # tilelang alone serves the seed's bench; TileKernels' sources are fetched by hand
  local tilekernels=1
  if [ ! -d "$root/.peers/tile_kernels" ]; then
    tilekernels=0
    echo "peer_setup: no $root/.peers/tile_kernels; TileKernels comparison skipped" \
         "(tilelang set up for the seed's kernel)" >&2
  fi
  # Extract once; a changed bundle (other checksum) is extracted afresh.
  sum=$(sha256sum "$bundle" | cut -d' ' -f1)
  stamp=$site/.peer_bundle.sha256
  if [ "$(cat "$stamp" 2>/dev/null)" != "$sum" ]; then
    rm -rf "$site" && mkdir -p "$site" &&
      tar -C "$site" -xJf "$bundle" &&
      echo "$sum" > "$stamp" ||
      { echo "peer_setup: could not extract $bundle" >&2; return 0; }
  fi
  case ":${PYTHONPATH:-}:" in
    *":$site:"*) ;;
    *) PYTHONPATH=$site:$root/.peers${PYTHONPATH:+:$PYTHONPATH} ;;
  esac
  export PYTHONPATH
  export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
  case ":$PATH:" in *":$CUDA_HOME/bin:"*) ;; *) export PATH=$CUDA_HOME/bin:$PATH ;; esac
  export TILELANG_CACHE_DIR=${TILELANG_CACHE_DIR:-/tmp/tilelang_cache}
  export TVM_FFI_CACHE_DIR=${TVM_FFI_CACHE_DIR:-/tmp/tvm_ffi_cache}
  export TILELANG_PRINT_ON_COMPILATION=${TILELANG_PRINT_ON_COMPILATION:-0}
  export PEER_TILEKERNELS=$tilekernels  # 1: .peers/tile_kernels/ is there
  if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    local v
    for v in PYTHONPATH CUDA_HOME PATH TILELANG_CACHE_DIR TVM_FFI_CACHE_DIR \
      TILELANG_PRINT_ON_COMPILATION PEER_TILEKERNELS; do
      printf 'export %s=%q\n' "$v" "${!v}"
    done
  fi
}
_peer_setup
unset -f _peer_setup
true
