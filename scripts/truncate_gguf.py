#!/usr/bin/env python3
"""Writes a copy of a GGUF model keeping only its first N transformer blocks.

The result is a smaller model with real weights and the original tokenizer
and metadata (block_count set to N): what the GPU check carries to a lent GPU
machine, where the whole default model (98 MB) exceeds what a call may carry,
to compare the GPU's greedy tokens with the CPU's on trained weights. Its
text is not the full model's; both engines read the same file.

usage: scripts/truncate_gguf.py INPUT.gguf OUTPUT.gguf --layers N
"""
import argparse
import re
import struct
import sys

# Sizes of the fixed-width GGUF metadata value types.
FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
STRING, ARRAY, UINT32 = 8, 9, 4


class Reader:
    def __init__(self, data):
        self.data, self.pos = data, 0

    def take(self, n):
        if self.pos + n > len(self.data):
            raise ValueError("truncated GGUF file")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def u32(self):
        return struct.unpack("<I", self.take(4))[0]

    def u64(self):
        return struct.unpack("<Q", self.take(8))[0]

    def string(self):
        return self.take(self.u64()).decode("utf-8")

    def skip_value(self, vtype):
        if vtype in FIXED:
            self.take(FIXED[vtype])
        elif vtype == STRING:
            self.take(self.u64())
        elif vtype == ARRAY:
            etype, count = self.u32(), self.u64()
            for _ in range(count):
                self.skip_value(etype)
        else:
            raise ValueError(f"unknown GGUF value type {vtype}")


def gguf_string(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("input")
    ap.add_argument("output")
    ap.add_argument("--layers", type=int, required=True, help="transformer blocks to keep (>= 1)")
    args = ap.parse_args()
    if args.layers < 1:
        sys.exit("truncate_gguf: --layers must be at least 1")
    try:
        with open(args.input, "rb") as f:
            data = f.read()
    except OSError as e:
        sys.exit(f"truncate_gguf: cannot read {args.input}: {e.strerror}")
    r = Reader(data)
    if r.take(4) != b"GGUF":
        sys.exit(f"truncate_gguf: {args.input} is not a GGUF file")
    version = r.u32()
    if version not in (2, 3):
        sys.exit(f"truncate_gguf: GGUF version {version} is not supported")
    n_tensors, n_kv = r.u64(), r.u64()

    # Metadata: copied byte for byte, except block_count and the alignment.
    kv_out, alignment, blocks = [], 32, None
    for _ in range(n_kv):
        start = r.pos
        key = r.string()
        vtype = r.u32()
        value_pos = r.pos
        r.skip_value(vtype)
        raw = data[start:r.pos]
        if key == "general.alignment" and vtype == UINT32:
            alignment = struct.unpack("<I", data[value_pos:value_pos + 4])[0]
        if key.endswith(".block_count") and vtype == UINT32:
            blocks = struct.unpack("<I", data[value_pos:value_pos + 4])[0]
            raw = gguf_string(key) + struct.pack("<II", UINT32, min(args.layers, blocks))
        kv_out.append(raw)
    if blocks is None:
        sys.exit("truncate_gguf: no <arch>.block_count in the metadata")
    if args.layers >= blocks:
        sys.exit(f"truncate_gguf: the model has {blocks} blocks; nothing to drop")

    tensors = []
    for _ in range(n_tensors):
        name = r.string()
        n_dims = r.u32()
        dims = [r.u64() for _ in range(n_dims)]
        ttype, offset = r.u32(), r.u64()
        tensors.append((name, dims, ttype, offset))
    data_start = (r.pos + alignment - 1) // alignment * alignment
    # Each tensor's bytes run to the next tensor's start (padding included).
    ends = sorted(t[3] for t in tensors) + [len(data) - data_start]
    size_of = {off: ends[i + 1] - off for i, off in enumerate(ends[:-1])}

    def keep(name):
        m = re.match(r"blk\.(\d+)\.", name)
        return m is None or int(m.group(1)) < args.layers

    kept = [t for t in tensors if keep(t[0])]
    header = bytearray(b"GGUF" + struct.pack("<IQQ", version, len(kept), n_kv))
    for raw in kv_out:
        header += raw
    body, infos = bytearray(), bytearray()
    for name, dims, ttype, offset in kept:
        body += b"\0" * ((-len(body)) % alignment)
        infos += gguf_string(name) + struct.pack("<I", len(dims))
        infos += b"".join(struct.pack("<Q", d) for d in dims)
        infos += struct.pack("<IQ", ttype, len(body))
        body += data[data_start + offset:data_start + offset + size_of[offset]]
    header += infos
    header += b"\0" * ((-len(header)) % alignment)
    with open(args.output, "wb") as f:
        f.write(header)
        f.write(body)
    print(f"truncate_gguf: {args.output}: {len(kept)} of {n_tensors} tensors, "
          f"{args.layers} of {blocks} blocks, {(len(header) + len(body)) / 2**20:.1f} MiB")


if __name__ == "__main__":
    try:
        main()
    except (ValueError, UnicodeDecodeError, struct.error) as e:
        sys.exit(f"truncate_gguf: {sys.argv[1] if len(sys.argv) > 1 else 'input'} is malformed: {e}")
