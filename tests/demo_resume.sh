#!/usr/bin/env bash
# The demo's --save / --resume: a run stopped after 9 steps and resumed from
# its checkpoint logs the same losses (CSV, %.9g) as the unbroken run, in the
# mode given by the environment. Usage: demo_resume.sh path/to/fashion_mnist
set -euo pipefail
demo=$1
data=/usr/share/datasets/fashion-mnist
if [ ! -r "$data/train-images-idx3-ubyte.gz" ]; then
  echo "SKIP demo_resume: no Fashion-MNIST in $data (Debian: dataset-fashion-mnist)"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
args=(--limit 600 --test-limit 200 --epochs 2 --batch 64 --no-progress)
"$demo" "${args[@]}" --log "$tmp/whole.csv" > /dev/null 2>&1
"$demo" "${args[@]}" --log "$tmp/a.csv" --save "$tmp/run.safetensors" --save-every 4 --stop-after 9 > /dev/null 2>&1
"$demo" "${args[@]}" --log "$tmp/b.csv" --resume "$tmp/run.safetensors" > "$tmp/b.out" 2>&1
grep -q "resumed .* at step 9" "$tmp/b.out" || { echo "demo_resume: no 'resumed ... at step 9' line"; cat "$tmp/b.out"; exit 1; }
if ! cmp <(tail -n +2 "$tmp/whole.csv") <(tail -n +2 "$tmp/a.csv"; tail -n +2 "$tmp/b.csv"); then
  echo "demo_resume: the resumed run's losses differ from the unbroken run's"
  diff <(tail -n +2 "$tmp/whole.csv") <(tail -n +2 "$tmp/a.csv"; tail -n +2 "$tmp/b.csv") | head
  exit 1
fi
ls "$tmp" | grep -q '\.tmp\.' && { echo "demo_resume: a temporary file was left behind"; exit 1; }
echo "demo_resume: $(($(wc -l < "$tmp/whole.csv") - 1)) steps, stopped after 9, resumed: identical losses"
