#!/usr/bin/python3
"""Safetensors interop check for ctpu, with numpy and json only (the Python
safetensors package is not in Debian).

  check_safetensors.py read FILE     check FILE against the format and list it
                                     (name dtype shape sum), one line each
  check_safetensors.py check FILE    read FILE and compare it with the
                                     reference tensors below, bit for bit
  check_safetensors.py write FILE    write the reference tensors to FILE with
                                     this file's own writer (another tensor
                                     order and JSON spacing than ctpu's)

The format (github.com/huggingface/safetensors): 8 bytes little-endian u64 N,
N bytes of JSON header (a dict of name -> {dtype, shape, data_offsets}, plus
an optional "__metadata__" dict of str -> str; trailing spaces allowed), then
the data section, which the tensors' offsets must cover exactly, without
overlap or holes. BF16 is read as '<u2', widened and shifted left 16 bits,
then viewed as float32.

tests/test_checkpoint.c writes the same reference tensors with ctpu_save
(and loads this script's file), so the formulas here and there must agree.
Exit status: 0 on success, 1 with a message on any violation or mismatch.
"""
import json
import struct
import sys

import numpy as np

MAX_HEADER = 100_000_000
SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
         "I32": 4, "U32": 4, "F32": 4, "F64": 8, "I64": 8, "U64": 8}
NUMPY = {"F32": "<f4", "I32": "<i4", "F64": "<f8", "I64": "<i8", "U8": "u1", "I8": "i1", "F16": "<f2",
         "I16": "<i2", "U16": "<u2", "U32": "<u4", "U64": "<u8", "BOOL": "?"}


def fail(msg):
    print("check_safetensors: " + msg, file=sys.stderr)
    sys.exit(1)


def bf16_to_f32(u16):
    return (u16.astype("<u4") << 16).view("<f4")


def f32_to_bf16_bits(f):
    """Round to nearest even (the values used here are exact in bf16)."""
    u = np.asarray(f, dtype="<f4").view("<u4").astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")


def reference():
    """name -> (dtype, shape, float or int values as numpy array)."""
    i = np.arange(24, dtype=np.float64)
    j = np.arange(15, dtype=np.float64)
    k = np.arange(7, dtype=np.int64)
    return {
        "f32": ("F32", (2, 3, 4), ((i - 7) * 0.375).astype("<f4").reshape(2, 3, 4)),
        "bf16": ("BF16", (5, 3), ((j * 3 - 20) * 0.125).astype("<f4").reshape(5, 3)),
        "i32": ("I32", (7,), (k * k * 100003 - 1234567).astype("<i4")),
        "scalar": ("F32", (), np.array(-2.5, dtype="<f4")),
        "empty": ("F32", (0, 3), np.zeros((0, 3), dtype="<f4")),
    }


def read(path):
    with open(path, "rb") as f:
        buf = f.read()
    if len(buf) < 8:
        fail(f"{path}: {len(buf)} bytes: no header length")
    (n,) = struct.unpack("<Q", buf[:8])
    if n > MAX_HEADER:
        fail(f"{path}: header length {n} above the limit")
    if 8 + n > len(buf):
        fail(f"{path}: header length {n} runs past the end ({len(buf)} bytes)")
    raw = buf[8:8 + n]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        fail(f"{path}: header is not UTF-8: {e}")
    if not text.startswith("{"):
        fail(f"{path}: header does not start with '{{'")
    try:
        header = json.loads(text.rstrip(" "))
    except json.JSONDecodeError as e:
        fail(f"{path}: header is not JSON: {e}")
    if not isinstance(header, dict):
        fail(f"{path}: header is not a JSON object")
    meta = header.pop("__metadata__", None)
    if meta is not None and (not isinstance(meta, dict) or
                             not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items())):
        fail(f"{path}: __metadata__ is not a str -> str map")
    data = buf[8 + n:]
    tensors, spans = {}, []
    for name, e in header.items():
        if not isinstance(e, dict) or not {"dtype", "shape", "data_offsets"} <= set(e):
            fail(f"{path}: tensor {name!r}: needs dtype, shape, data_offsets")
        dt, shape, offs = e["dtype"], e["shape"], e["data_offsets"]
        if dt not in SIZES:
            fail(f"{path}: tensor {name!r}: unknown dtype {dt!r}")
        if not isinstance(shape, list) or not all(isinstance(x, int) and x >= 0 for x in shape):
            fail(f"{path}: tensor {name!r}: bad shape {shape!r}")
        if (not isinstance(offs, list) or len(offs) != 2 or not all(isinstance(x, int) for x in offs)
                or not 0 <= offs[0] <= offs[1]):
            fail(f"{path}: tensor {name!r}: bad data_offsets {offs!r}")
        nbytes = SIZES[dt] * int(np.prod(shape, dtype=np.int64))
        if offs[1] - offs[0] != nbytes:
            fail(f"{path}: tensor {name!r}: data_offsets {offs} hold {offs[1] - offs[0]} bytes, {dt}{shape} needs {nbytes}")
        spans.append((offs[0], offs[1], name))
        chunk = data[offs[0]:offs[1]]
        if dt == "BF16":
            arr = bf16_to_f32(np.frombuffer(chunk, dtype="<u2")).reshape(shape)
        elif dt in NUMPY:
            arr = np.frombuffer(chunk, dtype=NUMPY[dt]).reshape(shape)
        else:
            arr = None   # F8 kinds: listed, not decoded
        tensors[name] = (dt, tuple(shape), arr)
    at = 0
    for b, e, name in sorted(spans):
        if b != at:
            fail(f"{path}: tensor {name!r}: begins at {b}, expected {at} ({'overlap' if b < at else 'hole'})")
        at = e
    if at != len(data):
        fail(f"{path}: the data section has {len(data)} bytes, the tensors cover {at}")
    return tensors, meta or {}, 8 + n


def cmd_read(path):
    tensors, meta, start = read(path)
    for name, (dt, shape, arr) in tensors.items():
        s = "-" if arr is None else repr(float(np.sum(arr, dtype=np.float64)))
        print(f"{name} {dt} {list(shape)} sum={s}")
    for k, v in meta.items():
        print(f"metadata {k}={v}")
    print(f"ok {path}: {len(tensors)} tensors, data at byte {start}")


def cmd_check(path):
    tensors, meta, start = read(path)
    ref = reference()
    if start % 8:
        fail(f"{path}: data section at byte {start}: ctpu pads the header to 8 bytes")
    if set(tensors) != set(ref):
        fail(f"{path}: tensors {sorted(tensors)}, expected {sorted(ref)}")
    for name, (dt, shape, want) in ref.items():
        got_dt, got_shape, got = tensors[name]
        if (got_dt, got_shape) != (dt, shape):
            fail(f"{path}: tensor {name!r} is {got_dt}{list(got_shape)}, expected {dt}{list(shape)}")
        if got.shape != want.shape or not np.array_equal(got.view("<u4"), want.view("<u4")):
            fail(f"{path}: tensor {name!r}: values differ: {got.ravel()[:8]} vs {want.ravel()[:8]}")
    if meta.get("writer") != "ctpu":
        fail(f"{path}: metadata writer={meta.get('writer')!r}, expected 'ctpu'")
    print(f"ok {path}: {len(ref)} reference tensors match bit for bit")


def cmd_write(path):
    ref = reference()
    header, chunks, at = {"__metadata__": {"format": "pt", "writer": "numpy"}}, [], 0
    for name in sorted(ref):   # bf16 first: later tensors start unaligned, which a reader must take
        dt, shape, arr = ref[name]
        b = f32_to_bf16_bits(arr).tobytes() if dt == "BF16" else arr.tobytes()
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [at, at + len(b)]}
        chunks.append(b)
        at += len(b)
    h = json.dumps(header).encode("utf-8")
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(chunks))
    print(f"wrote {path}: {len(ref)} tensors")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("read", "check", "write"):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    {"read": cmd_read, "check": cmd_check, "write": cmd_write}[sys.argv[1]](sys.argv[2])
