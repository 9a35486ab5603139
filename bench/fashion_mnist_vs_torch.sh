#!/bin/sh
# Side-by-side speed of the Fashion-MNIST recipe: examples/fashion_mnist in
# strict eager against bench/torch_mlp.py (Debian's python3-torch, run with
# /usr/bin/python3) at the same thread count, in one run so both see the same
# machine. Prints `name value unit` lines, ending with
#   ratio_strict_vs_torch_images_per_s R ratio
# usage: fashion_mnist_vs_torch.sh FASHION_MNIST_EXE TORCH_MLP_PY [threads] [epochs] [runs]
# Each side runs `runs` times (default 3), alternating; the median is reported.
set -eu
exe=$1
py=$2
threads=${3:-$(nproc)}
epochs=${4:-5}
runs=${5:-3}
if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
    echo "fashion_mnist_vs_torch: /usr/bin/python3 cannot import torch (apt-get install -y python3-torch)" >&2
    exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
field() { sed -n "s/^result .*$1=\([^ ]*\).*/\1/p" "$2"; }
median() { sort -g | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
i=0
while [ $i -lt "$runs" ]; do
    env -u TORCH_TPU_LAUNCH_BLOCKING -u TORCH_TPU_DEFER_AND_FUSE \
        "$exe" --threads "$threads" --epochs "$epochs" --no-progress > "$tmp/c$i" 2> "$tmp/c$i.err"
    OMP_NUM_THREADS="$threads" MKL_NUM_THREADS="$threads" /usr/bin/python3 "$py" --threads "$threads" --epochs "$epochs" > "$tmp/t$i"
    field images_per_s "$tmp/c$i" >> "$tmp/c_ips"
    field images_per_s "$tmp/t$i" >> "$tmp/t_ips"
    field test_accuracy "$tmp/c$i" >> "$tmp/c_acc"
    field test_accuracy "$tmp/t$i" >> "$tmp/t_acc"
    i=$((i + 1))
done
c=$(median < "$tmp/c_ips")
t=$(median < "$tmp/t_ips")
echo "threads $threads count"
echo "epochs $epochs count"
echo "strict_images_per_s $c images/s"
echo "torch_images_per_s $t images/s"
echo "strict_test_accuracy $(median < "$tmp/c_acc") fraction"
echo "torch_test_accuracy $(median < "$tmp/t_acc") fraction"
echo "ratio_strict_vs_torch_images_per_s $(awk -v c="$c" -v t="$t" 'BEGIN {printf "%.3f", c / t}') ratio"
