#!/usr/bin/env bash
# fashion_mnist --compile (issue 17), from defer and fuse, gives the loss
# curve and result strict --capturable gives, bytes for bytes (the last
# partial batch fails the shape guard and is captured on its own).
# Usage: demo_compile.sh path/to/fashion_mnist
set -euo pipefail
demo=$1
data=/usr/share/datasets/fashion-mnist
[ -d "$data" ] || { echo "SKIP demo_compile: no $data"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
a=(--epochs 1 --limit 1000 --test-limit 200 --batch 128 --no-progress)
env -u TORCH_TPU_LAUNCH_BLOCKING -u TORCH_TPU_DEFER_AND_FUSE "$demo" "${a[@]}" --capturable --log "$tmp/s.csv" > "$tmp/s.out" 2>&1
TORCH_TPU_DEFER_AND_FUSE=1 "$demo" "${a[@]}" --compile --log "$tmp/c.csv" > "$tmp/c.out" 2>&1
cmp "$tmp/s.csv" "$tmp/c.csv" || { echo "demo_compile: --compile's losses differ"; diff "$tmp/s.csv" "$tmp/c.csv" | head; exit 1; }
grep -q 'mode=compiled' "$tmp/c.out" || { echo "demo_compile: no mode=compiled"; cat "$tmp/c.out"; exit 1; }
[ "$(grep -a '^result' "$tmp/s.out" | sed 's/ images_per_s=.*//')" = "$(grep -a '^result' "$tmp/c.out" | sed 's/ images_per_s=.*//')" ] ||
  { echo "demo_compile: result lines differ"; grep -a '^result' "$tmp/s.out" "$tmp/c.out"; exit 1; }
st=0
"$demo" --compile --ddp > "$tmp/bad.out" 2>&1 || st=$?
[ "$st" -eq 2 ] && grep -q -- '--compile with --ddp' "$tmp/bad.out" || { echo "demo_compile: --compile --ddp gave $st"; cat "$tmp/bad.out"; exit 1; }
echo "demo_compile: fashion_mnist --compile identical to strict --capturable"
