#!/bin/sh
# bench/ddp at 1 and 2 processes, then 2 in defer and fuse, cut and kept (issue 19): `name value unit` lines from
# rank 0 of each run. usage: ddp.sh MPIRUN DDP_EXE [steps]
set -eu
mpirun=$1
exe=$2
steps=${3:-100}
run() { "$mpirun" --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader "$@"; }
for np in 1 2; do
    run -np "$np" "$exe" "$steps"
done
# defer and fuse at 2 processes: the all_reduce cutting the trace (the
# default) or kept inside the step (ctpu_dist_set_collective_cut(false))
TORCH_TPU_DEFER_AND_FUSE=1 run -np 2 "$exe" "$steps"
TORCH_TPU_DEFER_AND_FUSE=1 run -np 2 "$exe" "$steps" kept
# overlap: 4 buckets of at most 128 KiB (the MLP's layers), started from the
# backward's gradient hooks, against the same buckets reduced after backward
run -np 2 "$exe" "$steps" cut 128
run -np 2 "$exe" "$steps" cut 128 blocking
TORCH_TPU_DEFER_AND_FUSE=1 run -np 2 "$exe" "$steps" kept 128
TORCH_TPU_DEFER_AND_FUSE=1 run -np 2 "$exe" "$steps" kept 128 blocking
