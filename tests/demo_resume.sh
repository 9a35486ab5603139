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
"$demo" "${args[@]}" --log "$tmp/whole.csv" > "$tmp/whole.out" 2>&1
"$demo" "${args[@]}" --log "$tmp/a.csv" --save "$tmp/run.safetensors" --save-every 4 --stop-after 9 > "$tmp/a.out" 2>&1
grep -q "^epoch 1/2 .* (stopped after 9 of 10 batches)$" "$tmp/a.out" || { echo "demo_resume: the stopped epoch's line does not say so"; cat "$tmp/a.out"; exit 1; }
"$demo" "${args[@]}" --log "$tmp/b.csv" --resume "$tmp/run.safetensors" --save "$tmp/end.safetensors" > "$tmp/b.out" 2>&1
grep -q "resumed .* at step 9" "$tmp/b.out" || { echo "demo_resume: no 'resumed ... at step 9' line"; cat "$tmp/b.out"; exit 1; }
if ! cmp <(tail -n +2 "$tmp/whole.csv") <(tail -n +2 "$tmp/a.csv"; tail -n +2 "$tmp/b.csv"); then
  echo "demo_resume: the resumed run's losses differ from the unbroken run's"
  diff <(tail -n +2 "$tmp/whole.csv") <(tail -n +2 "$tmp/a.csv"; tail -n +2 "$tmp/b.csv") | head
  exit 1
fi
# the resumed epoch's train_loss counts the steps before the stop (the checkpoint carries their sum)
# (the losses and accuracy; compiles= counts this run's programs, which differ)
key() { grep "^$1" "$2" | grep -o "^[a-z]* [0-9/]*\|train_loss=[^ ]*\|test_accuracy=[^ ]*" | tr '\n' ' '; }
if [ "$(key epoch "$tmp/whole.out")" != "$(key epoch "$tmp/b.out")" ] || [ "$(key result "$tmp/whole.out")" != "$(key result "$tmp/b.out")" ]; then
  echo "demo_resume: the resumed run's epoch or result lines differ from the unbroken run's"
  diff <(key epoch "$tmp/whole.out"; key result "$tmp/whole.out") <(key epoch "$tmp/b.out"; key result "$tmp/b.out")
  exit 1
fi
# resuming a finished run trains nothing and prints the finished run's train_loss
"$demo" "${args[@]}" --resume "$tmp/end.safetensors" > "$tmp/c.out" 2>&1
want=$(grep -o "train_loss=[0-9.a-z]*" <(grep ^result "$tmp/whole.out"))
grep ^result "$tmp/c.out" | grep -q -- "$want" || { echo "demo_resume: a finished run resumed does not give $want"; cat "$tmp/c.out"; exit 1; }
# --resume with another recipe is refused, naming both
if "$demo" "${args[@]}" --resume "$tmp/run.safetensors" --lr 2e-3 > "$tmp/d.out" 2>&1 || ! grep -q "needs the same options" "$tmp/d.out"; then
  echo "demo_resume: --resume with another --lr was not refused"; cat "$tmp/d.out"; exit 1
fi
# --resume of a missing or corrupt file fails with the reason (it printed nothing)
printf 'garbage' > "$tmp/bad.safetensors"
for bad in "$tmp/absent.safetensors" "$tmp/bad.safetensors"; do
  if "$demo" "${args[@]}" --resume "$bad" > "$tmp/e.out" 2>&1 || ! grep -q -- "--resume: safetensors_open: $bad" "$tmp/e.out"; then
    echo "demo_resume: --resume $bad did not fail with its reason"; cat "$tmp/e.out"; exit 1
  fi
done
rm -f "$tmp/bad.safetensors"
ls "$tmp" | grep -q '\.tmp\.' && { echo "demo_resume: a temporary file was left behind"; exit 1; }
echo "demo_resume: $(($(wc -l < "$tmp/whole.csv") - 1)) steps, stopped after 9, resumed: identical losses"
