#!/usr/bin/env python3
"""The docs against the programs they describe (issue 20):
- README's "## Example" code block is examples/hello.c (after its header comment);
- the output README shows for it is what ./hello prints, in strict and debug eager;
- the shutdown summary line README quotes has the form hello's stderr has;
- the environment variables of README's table and DESIGN's table are the
  ones src/eager/env.h declares (runtime.c parses them from that list;
  tests/test_env.c checks the rows word for word), and tests/t_core.h's
  list is generated from it.
Usage: check_docs.py SOURCE_ROOT HELLO_EXE"""
import os
import re
import subprocess
import sys

root, hello = sys.argv[1], sys.argv[2]
fails = []


def read(p):
    with open(os.path.join(root, p), encoding="utf-8") as f:
        return f.read()


readme = read("README.md")
design = read("docs/DESIGN.md")

# 1. the example is hello.c
m = re.search(r"## Example\n\n```c\n(.*?)```\n", readme, re.S)
src = read("examples/hello.c")
body = re.sub(r"\A/\*.*?\*/\n", "", src, count=1, flags=re.S)
if not m:
    fails.append("README has no ## Example code block")
elif m.group(1) != body:
    fails.append("README's example differs from examples/hello.c")

# 2. its output, as README shows it
m = re.search(r"after a build, `\./build/examples/hello` runs it.*?\n\n```\n(.*?)```\n", readme, re.S)
env = dict(os.environ, CTPU_QUIET="1")
for k in list(env):
    if k.startswith("TORCH_TPU_") or k in ("CTPU_ISA",):
        del env[k]
got = subprocess.run([hello], env=env, capture_output=True, text=True, timeout=60)
if not m:
    fails.append("README shows no output block for hello")
elif got.stdout != m.group(1):
    fails.append("hello prints %r, README shows %r" % (got.stdout, m.group(1)))
dbg = subprocess.run([hello], env=dict(env, TORCH_TPU_LAUNCH_BLOCKING="1"), capture_output=True, text=True, timeout=60)
if m and dbg.stdout != m.group(1).replace("strict", "debug"):
    fails.append("hello in debug eager prints %r" % dbg.stdout)

# 3. the shutdown summary line's form
m = re.search(r"`(ctpu: compile cache: [^`]*)`", readme)
loud = dict(env)
del loud["CTPU_QUIET"]
err = subprocess.run([hello], env=loud, capture_output=True, text=True, timeout=60).stderr.strip()
if not m:
    fails.append("README quotes no shutdown summary line")
else:
    pat = re.escape(m.group(1))
    pat = re.sub(r"\d+(\\\.\d+)?", r"[0-9]+(\\.[0-9]+)?", pat)
    pat = pat.replace("defer_fuse", "[a-z_]+").replace("v5e", "[a-z0-9]+")
    if not re.fullmatch(pat, err):
        fails.append("hello's shutdown line %r does not have README's form %r" % (err, m.group(1)))

# 4. one set of environment variables
read_vars = set(re.findall(r"\bX\(((?:TORCH_TPU|TORCH_COMPILE|CTPU)_[A-Z0-9_]+),", read("src/eager/env.h")))
if not read_vars:
    fails.append("src/eager/env.h declares no variables")


def table_vars(text):
    m = re.search(r"\| variable \| default \| effect \|\n\|[-|]+\|\n((?:\|.*\n)+)", text)
    return set(re.findall(r"^\| `([A-Z0-9_]+)`", m.group(1), re.M)) if m else set()


dist = set(re.findall(r'getenv\("(CTPU_DIST_[A-Z0-9_]+)"\)', "".join(
    read(os.path.join("src", d, f)) for d in ("dist", "eager") for f in os.listdir(os.path.join(root, "src", d))
    if f.endswith(".c"))))
for name, text in (("README.md", readme), ("docs/DESIGN.md", design)):
    tv = table_vars(text)
    if not tv:
        fails.append("%s has no environment table" % name)
        continue
    missing = read_vars - tv
    extra = tv - read_vars - dist
    if missing:
        fails.append("%s's table lacks %s" % (name, ", ".join(sorted(missing))))
    if extra:
        fails.append("%s's table lists %s, which no code reads" % (name, ", ".join(sorted(extra))))
tcore = read("tests/t_core.h")
if "CTPU_ENV_VARS(" not in tcore.split("T_ENV_VARS[]")[1].split("};")[0]:
    fails.append("tests/t_core.h's T_ENV_VARS is not generated from src/eager/env.h's CTPU_ENV_VARS")

for f in fails:
    print("check_docs: " + f)
if fails:
    sys.exit(1)
print("check_docs: README's example, its output and summary line, and the environment tables match the code")
