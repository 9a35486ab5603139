#!/usr/bin/env bash
# Installs what is needed, builds, and runs the main job: the example in each
# execution mode (strict eager, debug eager, defer and fuse), then the
# Fashion-MNIST training demo (examples/fashion_mnist.c; the mode comes from
# the environment, strict eager by default; extra arguments go to the demo).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install-deps.sh
if [ -f build/build.ninja ]; then meson setup --reconfigure build >/dev/null; else meson setup build >/dev/null; fi
ninja -C build
for mode in strict debug fuse; do
  case $mode in
    strict) env -u TORCH_TPU_LAUNCH_BLOCKING -u TORCH_TPU_DEFER_AND_FUSE ./build/examples/hello ;;
    debug)  TORCH_TPU_LAUNCH_BLOCKING=1 ./build/examples/hello ;;
    fuse)   TORCH_TPU_DEFER_AND_FUSE=1 ./build/examples/hello ;;
  esac
done
./build/examples/fashion_mnist "$@"
