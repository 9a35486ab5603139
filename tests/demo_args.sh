#!/bin/sh
# The demo's and ctpu-report's command lines (getopt_long): --opt=value and
# --opt value alike, --version, and one-line errors naming the option.
# Usage: demo_args.sh FASHION_MNIST CTPU_REPORT
set -u
demo=$1
report=$2
fail() { echo "demo_args: $*" >&2; exit 1; }
expect() {   # expect STATUS PATTERN CMD...: exit status and a line of output
    want=$1 pat=$2
    shift 2
    out=$("$@" 2>&1)
    rc=$?
    [ "$rc" = "$want" ] || fail "$*: exit $rc, want $want: $out"
    printf '%s\n' "$out" | grep -q -- "$pat" || fail "$*: no '$pat' in: $out"
}
expect 0 "^fashion_mnist (ctpu [0-9][0-9.]*)$" "$demo" --version
expect 0 "Options take their value as --opt VALUE or --opt=VALUE" "$demo" --help
expect 2 "bad value '0' for --epochs" "$demo" --epochs=0
expect 2 "bad value 'x' for --lr" "$demo" --lr x
expect 2 "unknown option --bogus" "$demo" --bogus
expect 2 "unknown option --bogus=1" "$demo" --bogus=1
expect 2 "needs a value" "$demo" --epochs
expect 2 "unexpected argument stray" "$demo" stray
expect 2 "needs --save PATH" "$demo" --save-every=3
# integer options take integers only; --betas all of it, each in [0, 1) as torch.optim.AdamW
expect 2 "bad value '2000.7' for --limit" "$demo" --limit 2000.7
expect 2 "bad value '1.5' for --seed" "$demo" --seed 1.5
expect 2 "bad value '-1' for --seed" "$demo" --seed -1
expect 2 "bad value '0.9,0.999junk' for --betas" "$demo" --betas 0.9,0.999junk
expect 2 "bad value '1,0.5' for --betas" "$demo" --betas 1,0.5
# a prefix of two options is ambiguous, not unknown
expect 2 "ambiguous option --ep=1" "$demo" --ep=1
# --opt=value reaches the program: a missing data directory named from --data=
expect 1 "/nonexistent-ctpu-data" "$demo" --data=/nonexistent-ctpu-data --epochs=1
expect 0 "^ctpu-report (ctpu [0-9][0-9.]*)$" "$report" --version
expect 1 "use text, markdown or json" "$report" --format=xml x.json
expect 1 "unknown option --bogus" "$report" --bogus x.json
expect 1 "needs a value" "$report" x.json --plot
echo "demo_args: ok"
