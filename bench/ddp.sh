#!/bin/sh
# bench/ddp at 1 and 2 processes (issue 19): `name value unit` lines from
# rank 0 of each run. usage: ddp.sh MPIRUN DDP_EXE [steps]
set -eu
mpirun=$1
exe=$2
steps=${3:-100}
for np in 1 2; do
    "$mpirun" --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader -np "$np" "$exe" "$steps"
done
