#!/usr/bin/env python3
"""Header hygiene (issue 10): each public header compiles alone, included
twice, as C11 with -pedantic -Werror (and -Wall -Wextra -Wstrict-prototypes),
and as C++11 with -pedantic -Werror. Without a C++ compiler (g++ comes from
tools/install-deps.sh) the C++ part is skipped with a message; the C part
always runs.

Usage: check_headers.py --cc CC... [--cxx CXX...] --headers HEADER...
"""
import os
import subprocess
import sys
import tempfile

C_FLAGS = ["-std=c11", "-pedantic", "-Werror", "-Wall", "-Wextra", "-Wstrict-prototypes", "-fsyntax-only"]
CXX_FLAGS = ["-std=c++11", "-pedantic", "-Werror", "-Wall", "-Wextra", "-fsyntax-only"]


def compile_alone(cmd, flags, lang, header, tmp):
    name = os.path.basename(header)
    src = os.path.join(tmp, "%s_%s.%s" % (name.replace(".", "_"), lang, "c" if lang == "c" else "cc"))
    with open(src, "w") as f:
        f.write("#include <%s>\n#include <%s>\nint main(void) { return 0; }\n" % (name, name) if lang == "c" else
                "#include <%s>\n#include <%s>\nint main() { return 0; }\n" % (name, name))
    res = subprocess.run(cmd + flags + ["-I", os.path.dirname(os.path.abspath(header)), src],
                         capture_output=True, text=True)
    verdict = "ok" if res.returncode == 0 else "FAIL"
    print("%-12s %-4s %s" % (name, "C11" if lang == "c" else "C++", verdict))
    if res.returncode != 0:
        print(res.stdout + res.stderr)
    return res.returncode == 0


def main(argv):
    cc, cxx, headers, cur = [], [], [], None
    for a in argv:
        if a in ("--cc", "--cxx", "--headers"):
            cur = a
        elif cur == "--cc":
            cc.append(a)
        elif cur == "--cxx":
            cxx.append(a)
        elif cur == "--headers":
            headers.append(a)
    if not cc or not headers:
        print(__doc__)
        return 2
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for h in headers:
            ok &= compile_alone(cc, C_FLAGS, "c", h, tmp)
        if cxx:
            for h in headers:
                ok &= compile_alone(cxx, CXX_FLAGS, "cxx", h, tmp)
        else:
            print("SKIP the C++ part: meson found no C++ compiler (install g++: bash tools/install-deps.sh, "
                  "then meson setup --wipe)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
