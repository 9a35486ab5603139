#!/usr/bin/env bash
# The char-level GPT demo converges (issue 14): 100 steps of a small
# configuration (1 layer, 2 heads, dmodel 32, ctx 32, batch 64, lr 3e-2) in
# defer and fuse reach a val loss below 3.20 nats. Measured: 3.0661 at step
# 100 with SDPA (3.1368 when the attention was written out; val 4.74 = ln 114
# at initialisation; the corpus's byte unigram entropy is 3.32 nats, so a
# loss below 3.20 means the model uses its context). The
# run is bit-identical in every mode, ISA and thread count (char_gpt_golden
# checks that), so the figure is exact, not a noisy one; about 2 s of CPU.
# Under the sanitizer setups (CTPU_TEST_SANITIZED set) only the tiny
# configurations of the other char_gpt tests run: this one is skipped.
# Usage: char_gpt_converge.sh path/to/char_gpt
set -euo pipefail
demo=$1
data=/usr/share/games/fortunes
threshold=3.20
if [ -n "${CTPU_TEST_SANITIZED:-}" ]; then
  echo "SKIP char_gpt_converge: a sanitizer setup (CTPU_TEST_SANITIZED): only the tiny configurations run"
  exit 77
fi
if [ ! -d "$data" ]; then
  echo "SKIP char_gpt_converge: no $data (Debian: fortunes, fortunes-min)"
  exit 77
fi
out=$(TORCH_TPU_DEFER_AND_FUSE=1 "$demo" --data "$data" --layers 1 --heads 2 --dmodel 32 --ctx 32 --batch 64 \
      --steps 100 --lr 3e-2 --warmup 10 --eval-every 50 --eval-batches 4 --no-progress --sample 0 2>&1) ||
  { echo "char_gpt_converge: the run failed"; echo "$out"; exit 1; }
v=$(echo "$out" | sed -n 's/^result val_loss=\([0-9.]*\) .*/\1/p')
[ -n "$v" ] || { echo "char_gpt_converge: no result line"; echo "$out"; exit 1; }
awk -v v="$v" -v t="$threshold" 'BEGIN { exit !(v < t) }' ||
  { echo "char_gpt_converge: val loss $v after 100 steps, not below $threshold"; echo "$out" | grep '^step'; exit 1; }
echo "char_gpt_converge: val loss $v after 100 steps (threshold $threshold)"
