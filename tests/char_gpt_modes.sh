#!/usr/bin/env bash
# The char-level GPT demo (issue 14) in a tiny configuration: the --log CSVs
# of strict, debug (TORCH_TPU_LAUNCH_BLOCKING=1) and defer and fuse
# (TORCH_TPU_DEFER_AND_FUSE=1) are identical bytes, so are the generated
# samples after the result line, and the val loss after 20 steps is below the
# one after 10. Usage: char_gpt_modes.sh path/to/char_gpt
set -euo pipefail
demo=$1
data=/usr/share/games/fortunes
if [ ! -d "$data" ]; then
  echo "SKIP char_gpt_modes: no $data (Debian: fortunes, fortunes-min)"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
args=(--data "$data" --layers 1 --heads 2 --dmodel 16 --ctx 16 --batch 2 --steps 20 --lr 1e-2 --warmup 0
      --eval-every 10 --eval-batches 2 --no-progress --sample 40)
env -u TORCH_TPU_LAUNCH_BLOCKING -u TORCH_TPU_DEFER_AND_FUSE "$demo" "${args[@]}" --log "$tmp/strict.csv" > "$tmp/strict.out" 2>&1
TORCH_TPU_LAUNCH_BLOCKING=1 "$demo" "${args[@]}" --log "$tmp/debug.csv" > "$tmp/debug.out" 2>&1
TORCH_TPU_DEFER_AND_FUSE=1 "$demo" "${args[@]}" --log "$tmp/fused.csv" > "$tmp/fused.out" 2>&1
for m in strict debug fused; do
  grep -q '^result val_loss=.* compiles=.* recompiles=.* mode=' "$tmp/$m.out" || { echo "char_gpt_modes: no result line ($m)"; cat "$tmp/$m.out"; exit 1; }
done
grep -q 'mode=defer_fuse' "$tmp/fused.out" || { echo "char_gpt_modes: the fused run is not in defer_fuse mode"; exit 1; }
[ "$(wc -l < "$tmp/strict.csv")" -eq 21 ] || { echo "char_gpt_modes: expected 20 logged steps"; cat "$tmp/strict.csv"; exit 1; }
for m in debug fused; do
  if ! cmp "$tmp/strict.csv" "$tmp/$m.csv"; then
    echo "char_gpt_modes: $m's losses differ from strict's"
    diff "$tmp/strict.csv" "$tmp/$m.csv" | head
    exit 1
  fi
done
for m in strict debug fused; do sed -n '/^sample (/,/^ctpu cache report/p' "$tmp/$m.out" | grep -av '^ctpu cache report' > "$tmp/$m.sample"; done
[ "$(wc -c < "$tmp/strict.sample")" -gt 40 ] || { echo "char_gpt_modes: no sample after the result line"; cat "$tmp/strict.out"; exit 1; }
for m in debug fused; do
  cmp -s "$tmp/strict.sample" "$tmp/$m.sample" || { echo "char_gpt_modes: $m's sample differs from strict's"; diff "$tmp/strict.sample" "$tmp/$m.sample"; exit 1; }
done
# val losses logged at steps 10 and 20 (rows 10 and 20 of the CSV)
v=$(awk -F, 'NR > 1 && $4 != "" { print $4 }' "$tmp/strict.csv")
awk -v a="$(echo "$v" | head -1)" -v b="$(echo "$v" | tail -1)" 'BEGIN { exit !(b < a) }' ||
  { echo "char_gpt_modes: val loss did not decrease: $v"; exit 1; }
echo "char_gpt_modes: strict, debug and defer_fuse logs and samples identical; val loss $(echo $v | tr '\n' ' ')"
# compiled steps (issue 17): --compile (from defer and fuse) gives the bytes strict --capturable gives,
# capturing twice (the second tells the lr argument from equal constants) and replaying the rest
env -u TORCH_TPU_LAUNCH_BLOCKING -u TORCH_TPU_DEFER_AND_FUSE "$demo" "${args[@]}" --capturable --log "$tmp/cap.csv" > "$tmp/cap.out" 2>&1
TORCH_TPU_DEFER_AND_FUSE=1 "$demo" "${args[@]}" --compile --log "$tmp/comp.csv" > "$tmp/comp.out" 2>&1
grep -q 'mode=compiled' "$tmp/comp.out" || { echo "char_gpt_modes: the --compile run's result line"; cat "$tmp/comp.out"; exit 1; }
grep -q 'compiled step: calls=20 captures=2 replays=18 guard_failures=0 graph_breaks=0' "$tmp/comp.out" ||
  { echo "char_gpt_modes: the compiled step's counts"; grep -a 'compiled step' "$tmp/comp.out"; exit 1; }
cmp "$tmp/cap.csv" "$tmp/comp.csv" || { echo "char_gpt_modes: --compile's losses differ from strict --capturable's"; diff "$tmp/cap.csv" "$tmp/comp.csv" | head; exit 1; }
echo "char_gpt_modes: --compile identical to strict --capturable"
# bad input: a one-line message naming the option, exit status 2 (usage) or 1 (data), nothing else
check_bad() { # want-status want-text args...
  local want=$1 text=$2; shift 2
  local st=0
  "$demo" "$@" > "$tmp/bad.out" 2>&1 || st=$?
  [ "$st" -eq "$want" ] && grep -q -- "$text" "$tmp/bad.out" ||
    { echo "char_gpt_modes: $* gave status $st (want $want, '$text')"; cat "$tmp/bad.out"; exit 1; }
}
check_bad 2 "bad value 'f16' for --dtype" --dtype f16
check_bad 2 "bad value '' for --prompt" --prompt ''
check_bad 2 "bad value '-1' for --temperature" --temperature -1
check_bad 2 "--by-document needs --ctx 2" --by-document --ctx 1
check_bad 1 "fewer than --batch 20000" --data "$data" --by-document --batch 20000 --ctx 16
echo "char_gpt_modes: bad options refused"
