#!/usr/bin/env bash
# Functions longer than a limit (default 120 lines, from the line of the
# opening brace to the closing one; STYLE.md: a function does one thing).
# Usage: check-fn-length.sh [-n LIMIT] file.c...   Exit status 1 if any.
set -euo pipefail
limit=120
if [ "${1:-}" = -n ]; then limit=$2; shift 2; fi
awk -v LIMIT="$limit" '
  FNR == 1 { start = 0; prev = "" }
  /^\{/ { start = FNR; name = prev; next }
  /^\}/ { if (start && FNR - start + 1 > LIMIT) { printf "%s:%d: %s (%d lines)\n", FILENAME, start, name, FNR - start + 1; bad = 1 }
          start = 0 }
  /^[A-Za-z_].*\(/ { prev = $0 }
  END { exit bad }' "$@"
