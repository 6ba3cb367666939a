#!/bin/bash
# Make room for the SGLang carry in one device call (64 MiB for the working tree and the carried paths
# together): the tree is ~28 MiB, .carry/sglang/parts ~52 MiB. `out` moves the largest tracked files that no
# GPU script reads (serving record tarballs, the cluster simulation, the format study, SmolLM2's KV sample,
# the Mooncake trace) into .cache/held (git-ignored); `in` puts them back. Never commit between the two:
# git would record them as deleted.
#   bash scripts/device_slim.sh out   ...device calls...   bash scripts/device_slim.sh in
set -euo pipefail
cd "$(dirname "$0")/.."
HELD=.cache/held
case "${1:-}" in
  out)
    for f in bench/results/*records.tgz bench/results/cluster_sim.json bench/results/format_study.json \
             bench/data/smollm2_kv.npz bench/data/traces/mooncake_conversation_trace.jsonl; do
      [ -f "$f" ] || continue
      mkdir -p "$HELD/$(dirname "$f")" && mv "$f" "$HELD/$f"
    done
    echo "held: $(find "$HELD" -type f | wc -l) files; tree now $(git ls-files -z | xargs -0 du -cm 2>/dev/null | tail -1 | cut -f1) MiB of tracked files present" ;;
  in)
    [ -d "$HELD" ] || { echo "nothing held"; exit 0; }
    (cd "$HELD" && find . -type f) | while read -r f; do mkdir -p "$(dirname "$f")" && mv "$HELD/$f" "$f"; done
    rm -rf "$HELD"
    git status --short | head -5 ;;
  *) echo "usage: $0 out|in" >&2; exit 2 ;;
esac
