#!/usr/bin/env python3
"""libctpu.so exports exactly the public API (issue 10, "Rooms and linkage").

The library is compiled with -fvisibility=hidden; include/ctpu.h's CTPU_API
(default visibility) marks each public function. This test reads every
function declared in the public headers, checks that each declaration carries
CTPU_API, and compares that list with the dynamic symbols the shared library
defines (nm -D --defined-only). The one allowed extra is jemalloc's
`malloc_conf` (src/device/device.c; required when built with jemalloc).
With --pc DIR (the folder holding the generated ctpu.pc), also checks that
`pkg-config --cflags ctpu` gives only ctpu's own include folder: private
dependencies (cJSON's -I/usr/include/cjson) belong in Libs.private.

Usage: check_exports.py --nm NM --lib libctpu.so [--jemalloc] [--pc DIR] HEADER...
"""
import os
import re
import subprocess
import sys

# Linker-defined and sanitizer-runtime names an instrumented or plain shared
# object may carry beside its own.
TOOLCHAIN = re.compile(r"^(_init|_fini|_edata|_end|__bss_start|__(asan|odr_asan|ubsan|tsan|sancov|lsan)\w*|"
                       r"___asan\w*|__start_\w+|__stop_\w+)$")


def strip_comments_and_directives(text):
    out, i, n = [], 0, len(text)
    while i < n:
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
            out.append(" ")
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text[i] == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        else:
            out.append(text[i])
            i += 1
    lines, keep, cont = "".join(out).split("\n"), [], False
    for line in lines:
        directive = cont or line.lstrip().startswith("#")
        cont = directive and line.rstrip().endswith("\\")
        keep.append("" if directive else line)
    return "\n".join(keep)


def matching(text, i, open_c, close_c):
    depth = 0
    for j in range(i, len(text)):
        if text[j] == open_c:
            depth += 1
        elif text[j] == close_c:
            depth -= 1
            if depth == 0:
                return j
    raise ValueError("unbalanced %s at offset %d" % (open_c, i))


def statements(text):
    """Top-level statements: ('decl', text) ending in ';', ('def', text) for
    a function with a body. Struct/enum bodies are replaced by {}."""
    text = re.sub(r'extern\s*"C"\s*\{', " ", text)
    out, cur, i = [], [], 0
    while i < len(text):
        c = text[i]
        if c == "{":
            j = matching(text, i, "{", "}")
            head = "".join(cur).strip()
            if head.endswith(")"):
                out.append(("def", head))
                cur = []
            else:
                cur.append("{}")
            i = j + 1
        elif c == "}":  # the closing brace of extern "C"
            i += 1
        elif c == ";":
            out.append(("decl", "".join(cur)))
            cur = []
            i += 1
        else:
            cur.append(c)
            i += 1
    return [(k, " ".join(s.split())) for k, s in out if s.strip()]


def declared(header, problems):
    names = set()
    for kind, s in statements(strip_comments_and_directives(open(header, encoding="utf-8").read())):
        words = s.split()
        if kind == "def":
            if words[0] != "static":
                problems.append("%s: non-static function defined in a public header: %s" % (header, s[:80]))
            continue
        if words[0] == "typedef" or (words[0] in ("struct", "enum", "union") and "(" not in s
                                      and not re.search(r"\}\s*\w", s)):
            continue
        m = re.search(r"([A-Za-z_]\w*)\s*\(", s)
        if m:  # a function declaration
            name = m.group(1)
            if "CTPU_API" not in s[:m.start()].split():
                problems.append("%s: %s is declared without CTPU_API (it would not be exported): "
                                "write `CTPU_API <type> %s(...);`" % (header, name, name))
        elif words[0] == "extern":
            name = re.findall(r"([A-Za-z_]\w*)\s*(?:\[[^\]]*\]\s*)*$", s.split("=")[0])[0]
            if "CTPU_API" not in words:
                problems.append("%s: variable %s is declared without CTPU_API" % (header, name))
        else:
            problems.append("%s: a declaration this test cannot read: %s" % (header, s[:80]))
            continue
        names.add(name)
    return names


def main(argv):
    nm, lib, jemalloc, pc, headers = None, None, False, None, []
    it = iter(argv)
    for a in it:
        if a == "--nm":
            nm = next(it)
        elif a == "--lib":
            lib = next(it)
        elif a == "--pc":
            pc = next(it)
        elif a == "--jemalloc":
            jemalloc = True
        else:
            headers.append(a)
    if not nm or not lib or not headers:
        print(__doc__)
        return 2
    problems = []
    public = set()
    for h in headers:
        public |= declared(h, problems)
    res = subprocess.run([nm, "-D", "--defined-only", lib], capture_output=True, text=True)
    if res.returncode != 0:
        print("%s -D %s failed: %s" % (nm, lib, res.stderr.strip()))
        return 1
    exported = set()
    for line in res.stdout.splitlines():
        f = line.split()
        if len(f) >= 2 and not TOOLCHAIN.match(f[-1]):
            exported.add(f[-1].split("@")[0])
    extra = {"malloc_conf"}
    for s in sorted(exported - public - extra):
        problems.append("%s exports %s, which include/ does not declare: an internal function must "
                        "not be exported (keep it out of include/; tests call hooks through src/testing.h)" % (lib, s))
    for s in sorted(public - exported):
        problems.append("%s declares %s but %s does not export it (missing CTPU_API, or no definition)"
                        % ("include/", s, lib))
    if jemalloc and "malloc_conf" not in exported:
        problems.append("%s does not export malloc_conf: jemalloc would not read oversize_threshold:0 and "
                        "buffers above 8 MiB would leave the HBM arena (src/device/device.c)" % lib)
    if pc:
        env = dict(os.environ, PKG_CONFIG_PATH=pc)
        q = lambda *args: subprocess.run(["pkg-config"] + list(args) + ["ctpu"], env=env, capture_output=True,
                                         text=True)
        cflags, incdir = q("--cflags"), q("--variable=includedir")
        if cflags.returncode != 0 or incdir.returncode != 0:
            problems.append("pkg-config on %s/ctpu.pc failed: %s" % (pc, (cflags.stderr + incdir.stderr).strip()))
        elif cflags.stdout.split() != ["-I" + incdir.stdout.strip()]:
            problems.append("pkg-config --cflags ctpu gives %r: only -I%s expected (private dependencies go to "
                            "Libs.private, src/meson.build)" % (cflags.stdout.strip(), incdir.stdout.strip()))
        else:
            print("pkg-config --cflags ctpu: %s" % cflags.stdout.strip())
    for p in problems:
        print(p)
    print("%d public declarations in %d headers, %d exported symbols: %s"
          % (len(public), len(headers), len(exported), "FAIL" if problems else "ok"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
