#!/usr/bin/env bash
# Installs a built tree into a temporary root (meson install --destdir) and
# builds and runs examples/hello.c against it with pkg-config alone, as the
# README's "Installing to a prefix" section tells a user to (a stage of
# tools/run-tests.sh; not a meson test, since it installs).
#   tools/check-install.sh [BUILD_DIR]      (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
root=$(mktemp -d /tmp/ctpu-install-XXXXXX)
trap 'rm -rf "$root"' EXIT
meson install -C "$build" --no-rebuild --quiet --destdir "$root" >/dev/null
prefix=$(meson introspect "$build" --buildoptions | python3 -c \
  'import json,sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"] == "prefix"))')
pc=$(find "$root" -name ctpu.pc | head -1)
[ -n "$pc" ] || { echo "check-install: no ctpu.pc installed under $root" >&2; exit 1; }
pcdir=$(dirname "$pc")
echo "check-install: ctpu.pc in ${pcdir#$root}"
# the installed tree lives under $root$prefix: tell pkg-config so
pkc() { PKG_CONFIG_PATH="$pcdir" pkg-config --define-variable=prefix="$root$prefix" "$@" ctpu; }
cflags=$(pkc --cflags)
libs=$(pkc --libs)
echo "check-install: cflags: $cflags"
echo "check-install: libs:   $libs"
case " $cflags " in
  *cjson*|*sleef*|*xxhash*) echo "check-install: private dependencies leak into the public cflags" >&2; exit 1 ;;
esac
libdir=$(pkc --variable=libdir)
[ -e "$libdir/libctpu.so" ] || { echo "check-install: no libctpu.so in $libdir" >&2; exit 1; }
# shared, found at run time through the rpath (no LD_LIBRARY_PATH)
cc -std=c11 -o "$root/hello" examples/hello.c $cflags $libs -Wl,-rpath,"$libdir"
out=$(env -u LD_LIBRARY_PATH CTPU_QUIET=1 "$root/hello")
[ "$out" = "sum = 14 (mode strict)" ] || { echo "check-install: hello printed '$out'" >&2; exit 1; }
# without the rpath, LD_LIBRARY_PATH finds it
cc -std=c11 -o "$root/hello2" examples/hello.c $cflags $libs
out=$(LD_LIBRARY_PATH="$libdir" CTPU_QUIET=1 "$root/hello2")
[ "$out" = "sum = 14 (mode strict)" ] || { echo "check-install: hello (LD_LIBRARY_PATH) printed '$out'" >&2; exit 1; }
# the installed ctpu-report starts from the prefix (its RUNPATH), no LD_LIBRARY_PATH
bindir=$(meson introspect "$build" --buildoptions | python3 -c \
  'import json,sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"] == "bindir"))')
case $bindir in /*) ;; *) bindir=$prefix/$bindir ;; esac
env -u LD_LIBRARY_PATH "$root$bindir/ctpu-report" --version >/dev/null ||
  { echo "check-install: the installed ctpu-report does not start" >&2; exit 1; }
# static: pkg-config --static adds Libs.private
if [ -e "$libdir/libctpu.a" ]; then
  cc -std=c11 -o "$root/hello3" examples/hello.c $cflags -L"$libdir" -Wl,-Bstatic -lctpu -Wl,-Bdynamic \
    $(pkc --static --libs | sed 's/-lctpu//')
  out=$(CTPU_QUIET=1 "$root/hello3")
  [ "$out" = "sum = 14 (mode strict)" ] || { echo "check-install: hello (static) printed '$out'" >&2; exit 1; }
fi
echo "check-install: ok (installed under ${prefix}, hello built with pkg-config alone: shared with rpath, LD_LIBRARY_PATH, static; bin/ctpu-report runs)"
