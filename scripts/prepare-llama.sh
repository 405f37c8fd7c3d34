#!/bin/sh
# Compatibility shim for existing callers: prepare-llama.sh pinned|latest|<sha> [extra invoke flags]
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
mode=${1:-pinned}
[ "$#" -gt 0 ] && shift
cd "$here"
case "$mode" in
  pinned) exec invoke prepare --pinned "$@" ;;
  latest) exec invoke prepare --latest "$@" ;;
  -h|--help) echo "usage: $0 pinned|latest|<sha> [--force] [--offline] [--json]"; exit 0 ;;
  *) exec invoke prepare --sha "$mode" "$@" ;;
esac
