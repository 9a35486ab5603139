#!/usr/bin/env bash
# Installs what is needed, builds, and runs the whole test suite:
#   1. the default build (jemalloc device allocator): every Check suite;
#   2. the core suites again with the AVX2 and scalar kernels forced (CTPU_ISA);
#      then an install into a temporary root, with examples/hello.c built
#      against it by pkg-config alone (tools/check-install.sh);
#   3. an ASan+UBSan build with the system allocator: every suite;
#   4. a TSan build: the threads suite.
# The long runs (fuzz campaign, 1,000,000-step soak): meson test -C build --suite long.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install-deps.sh

setup() { # dir, options...
  local dir=$1; shift
  if [ -f "$dir/build.ninja" ]; then meson setup --reconfigure "$dir" "$@" >/dev/null
  else meson setup "$dir" "$@" >/dev/null; fi
}

setup build
ninja -C build
meson test -C build --print-errorlogs --num-processes 2

for isa in avx2 scalar; do
  if grep -q ' avx2 ' /proc/cpuinfo || [ "$isa" = scalar ]; then
    echo "== core suites with CTPU_ISA=$isa"
    CTPU_ISA=$isa meson test -C build --suite core --print-errorlogs --num-processes 2
  fi
done

echo "== install into a temporary prefix; hello.c built with pkg-config alone"
bash tools/check-install.sh build

echo "== ASan+UBSan, system allocator"
setup build-asan -Db_sanitize=address,undefined -Db_lundef=false -Dallocator=system -Dbuildtype=debugoptimized
ninja -C build-asan
meson test -C build-asan --setup=asan --print-errorlogs --num-processes 2

# Issue 7: the concurrency suite under ThreadSanitizer (the fuzz, hostile and
# soak suites ran above, in the default build and under ASan+UBSan).
echo "== ThreadSanitizer, system allocator: threads suite"
setup build-tsan -Db_sanitize=thread -Db_lundef=false -Dallocator=system -Dbuildtype=debugoptimized
ninja -C build-tsan tests/test_threads
meson test -C build-tsan --no-rebuild --suite threads --setup=tsan --print-errorlogs --num-processes 2
