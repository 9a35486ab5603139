#!/usr/bin/env bash
# The char-level GPT demo's --save / --resume (issue 21) in char_gpt_modes's
# tiny configuration, with dropout (so the generator's state matters): a run
# stopped after 13 steps (inside an evaluation interval, checkpoints every 4)
# and resumed from its checkpoint logs the same CSV (%.9g, headers aside) as
# the unbroken run, in the mode given by the environment.
# Usage: char_gpt_resume.sh path/to/char_gpt
set -euo pipefail
demo=$1
data=/usr/share/games/fortunes
if [ ! -d "$data" ]; then
  echo "SKIP char_gpt_resume: no $data (Debian: fortunes, fortunes-min)"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
args=(--data "$data" --layers 1 --heads 2 --dmodel 16 --ctx 16 --batch 2 --steps 20 --lr 1e-2 --warmup 2
      --eval-every 10 --eval-batches 2 --dropout 0.1 --no-progress --sample 0)
"$demo" "${args[@]}" --log "$tmp/whole.csv" > "$tmp/whole.out" 2>&1
"$demo" "${args[@]}" --log "$tmp/a.csv" --save "$tmp/run.safetensors" --save-every 4 --stop-after 13 > "$tmp/a.out" 2>&1
"$demo" "${args[@]}" --log "$tmp/b.csv" --resume "$tmp/run.safetensors" > "$tmp/b.out" 2>&1
grep -q "resumed .* at step 13 (3 steps into the interval)" "$tmp/b.out" ||
  { echo "char_gpt_resume: no 'resumed ... at step 13' line"; cat "$tmp/b.out"; exit 1; }
[ "$(wc -l < "$tmp/whole.csv")" -eq 21 ] || { echo "char_gpt_resume: expected 20 logged steps"; cat "$tmp/whole.csv"; exit 1; }
if ! cmp <(tail -n +2 "$tmp/whole.csv") <(tail -n +2 "$tmp/a.csv"; tail -n +2 "$tmp/b.csv"); then
  echo "char_gpt_resume: the resumed run's log differs from the unbroken run's"
  diff <(tail -n +2 "$tmp/whole.csv") <(tail -n +2 "$tmp/a.csv"; tail -n +2 "$tmp/b.csv") | head
  exit 1
fi
# the result lines (losses, steps) agree too
w=$(grep '^result' "$tmp/whole.out" | sed 's/ tokens_per_s=[0-9]*//; s/ compiles=.*//')
r=$(grep '^result' "$tmp/b.out" | sed 's/ tokens_per_s=[0-9]*//; s/ compiles=.*//')
[ "$w" = "$r" ] || { echo "char_gpt_resume: result lines differ: '$w' vs '$r'"; exit 1; }
# stopped before the first evaluation: no loss measured yet, the result line says nan (not 0.0000)
"$demo" "${args[@]}" --stop-after 5 > "$tmp/d.out" 2>&1
grep -q '^result val_loss=nan train_loss=nan steps=5 ' "$tmp/d.out" ||
  { echo "char_gpt_resume: a run stopped before any evaluation should report nan losses"; cat "$tmp/d.out"; exit 1; }
# --compile under TORCH_COMPILE_DISABLE=1: the result line names the mode that ran, not "compiled"
TORCH_COMPILE_DISABLE=1 "$demo" "${args[@]}" --compile --stop-after 3 > "$tmp/e.out" 2>&1
grep -q 'compilation disabled' "$tmp/e.out" && ! grep -q '^result .*mode=compiled' "$tmp/e.out" ||
  { echo "char_gpt_resume: TORCH_COMPILE_DISABLE=1 --compile should not report mode=compiled"; cat "$tmp/e.out"; exit 1; }
# resuming with another --seed is refused
if "$demo" "${args[@]}" --seed 2 --resume "$tmp/run.safetensors" > "$tmp/c.out" 2>&1; then
  echo "char_gpt_resume: resuming with another --seed was accepted"; exit 1
fi
grep -q "saved with --seed 1" "$tmp/c.out" || { echo "char_gpt_resume: no --seed message"; cat "$tmp/c.out"; exit 1; }
ls "$tmp" | grep -q '\.tmp\.' && { echo "char_gpt_resume: a temporary file was left behind"; exit 1; }
echo "char_gpt_resume: 20 steps, stopped after 13, resumed: identical log"
