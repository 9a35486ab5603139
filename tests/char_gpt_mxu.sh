#!/usr/bin/env bash
# The char-level GPT demo's attention MXU report (issue 14): for --head-dim
# 64 and 128 at T = 128, each chip's line gives q@k^T and p@v utilisations
# equal to the cost formula's useful / padded MACs (include/ctpu.h: M, K, N
# each padded up to the MXU side), pinned as well: v5e (128x128) 50.0% and
# 100.0%, v6e (256x256) 6.2% and 12.5%; on a 256-wide MXU head_dim 64 costs
# the time of 128 (the padding waste the TPU documentation warns about).
# Usage: char_gpt_mxu.sh path/to/char_gpt
set -euo pipefail
demo=$1
data=/usr/share/games/fortunes
if [ ! -d "$data" ]; then
  echo "SKIP char_gpt_mxu: no $data (Debian: fortunes, fortunes-min)"
  exit 77
fi
declare -A want=([v5e.64]=50.0 [v5e.128]=100.0 [v6e.64]=6.2 [v6e.128]=12.5)
declare -A us
for hd in 64 128; do
  out=$("$demo" --data "$data" --layers 1 --heads 2 --dmodel 16 --head-dim "$hd" --ctx 128 --batch 2 --steps 1 \
        --eval-every 1 --eval-batches 1 --no-progress --sample 0 2>&1) || { echo "char_gpt_mxu: run failed"; echo "$out"; exit 1; }
  lines=$(echo "$out" | grep -E '^  [0-9a-z]+, [0-9]+x[0-9]+ MXU: q@k\^T') ||
    { echo "char_gpt_mxu: no attention report (head_dim $hd)"; echo "$out" | tail -20; exit 1; }
  [ "$(echo "$lines" | wc -l)" -eq 4 ] || { echo "char_gpt_mxu: expected 4 chips"; echo "$lines"; exit 1; }
  while read -r line; do
    # "  v5e, 128x128 MXU: q@k^T [128,64]x[64,128] 50.0% of MACs useful (0.0852 us); p@v [...]x[...] 50.0% ... (… us)"
    re='^ *([0-9a-z]+), ([0-9]+)x[0-9]+ MXU: q@k\^T \[([0-9]+),([0-9]+)\]x\[([0-9]+),([0-9]+)\] ([0-9.]+)% of MACs useful \(([0-9.e+-]+) us\); p@v \[([0-9]+),([0-9]+)\]x\[([0-9]+),([0-9]+)\] ([0-9.]+)% of MACs useful \(([0-9.e+-]+) us\)$'
    [[ $line =~ $re ]] || { echo "char_gpt_mxu: cannot read: $line"; exit 1; }
    read -r chip side m k k2 n pqk tqk m2 k3 k4 n2 ppv tpv <<< "${BASH_REMATCH[*]:1}"
    [ "$k" = "$hd" ] && [ "$k2" = "$hd" ] && [ "$n2" = "$hd" ] && [ "$m" = 128 ] && [ "$k3" = 128 ] ||
      { echo "char_gpt_mxu: unexpected shapes: $line"; exit 1; }
    for prod in "qk $m $k $n $pqk" "pv $m2 $k3 $n2 $ppv"; do
      read -r name a b c got <<< "$prod"
      exp=$(awk -v a="$a" -v b="$b" -v c="$c" -v s="$side" 'function pad(x) { return int((x + s - 1) / s) * s }
            BEGIN { printf "%.1f", 100 * a * b * c / (pad(a) * pad(b) * pad(c)) }')
      [ "$got" = "$exp" ] || { echo "char_gpt_mxu: $chip $name head_dim $hd: $got%, the formula gives $exp%"; exit 1; }
    done
    if [ -n "${want[$chip.$hd]:-}" ] && { [ "$pqk" != "${want[$chip.$hd]}" ] || [ "$ppv" != "${want[$chip.$hd]}" ]; }; then
      echo "char_gpt_mxu: $chip head_dim $hd: $pqk% / $ppv%, pinned ${want[$chip.$hd]}%"; exit 1
    fi
    us[$chip.$hd]=$tqk
  done <<< "$lines"
done
[ "${us[v6e.64]}" = "${us[v6e.128]}" ] ||
  { echo "char_gpt_mxu: on v6e head_dim 64 should cost what 128 costs (padded): ${us[v6e.64]} vs ${us[v6e.128]} us"; exit 1; }
echo "char_gpt_mxu: v5e 50.0% / 100.0%, v6e 6.2% / 12.5% (head_dim 64 / 128), as the formula gives"
