#!/usr/bin/env bash
# Layering of the core library (docs/DESIGN.md "Folders"), checked on the
# objects: no object of a layer references a symbol defined by a layer above
# it. Layers, bottom up: kernels, ops (the op table), cost, device, dist (the
# MPI engine on raw buffers), fuse, eager (with src/dist/ici.c, the ICI cost
# model: eager calls it and it reports errors through eager), report, nn.
# Usage: check-layers.sh libctpu.a src-dir
set -euo pipefail
export LC_ALL=C
lib=$1 src=$2
layers=(kernels ops cost device dist fuse eager report nn)
# the layer of an archive member (meson names it by its path under src/,
# except the kernels' and nn's own static libraries: their file names)
layer_of() {
  case $1 in
    ops.c.o) echo ops ;;
    dist_ici.c.o) echo eager ;;
    cost_*|device_*|dist_*|fuse_*|eager_*|report_*) echo "${1%%_*}" ;;
    *) if [ -e "$src/nn/${1%.o}" ]; then echo nn
       elif [ -e "$src/kernels/${1%.o}" ]; then echo kernels
       else echo unknown; fi ;;
  esac
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
nm -A "$lib" > "$tmp/nm"
declare -A rank
for i in "${!layers[@]}"; do rank[${layers[$i]}]=$i; done
members=$(awk -F: '{print $2}' "$tmp/nm" | sort -u)
for m in $members; do
  l=$(layer_of "$m")
  if [ "$l" = unknown ]; then echo "check-layers: $m: no layer" >&2; exit 1; fi
  echo "$m $l" >> "$tmp/members"
  awk -F: -v m="$m" '$2 == m' "$tmp/nm" | awk '$(NF-1) ~ /^[TDBRCVW]$/ {print $NF}' | sed "s/\$/ $l/" >> "$tmp/defs"
done
sort -u "$tmp/defs" > "$tmp/defs.s"
bad=0
while read -r m l; do
  awk -F: -v m="$m" '$2 == m' "$tmp/nm" | awk '$(NF-1) == "U" {print $NF}' | sort -u > "$tmp/undef"
  while read -r sym dl; do
    if [ "${rank[$dl]}" -gt "${rank[$l]}" ]; then
      echo "check-layers: $m ($l) references $sym, defined in $dl (a layer above)"
      bad=1
    fi
  done < <(join "$tmp/undef" "$tmp/defs.s")
done < "$tmp/members"
[ $bad = 0 ] && echo "check-layers: $(wc -l < "$tmp/members") objects, layering holds (${layers[*]})"
exit $bad
