#!/usr/bin/env python3
"""Read the character vectors (one novel each, one element per line of text)
out of janeaustenr's R lazy-load database data/Rdata.rdb, without R.
Each record: 4-byte big-endian uncompressed length + a zlib stream holding an
R XDR serialization ("X\n", format version 2 or 3) of a STRSXP."""
import struct, sys, zlib

def records(path):
    data = open(path, 'rb').read()
    pos = 0
    while pos < len(data):
        (n,) = struct.unpack('>I', data[pos:pos + 4])
        d = zlib.decompressobj()
        out = d.decompress(data[pos + 4:])
        assert len(out) == n, (len(out), n)
        pos = len(data) - len(d.unused_data)
        yield out

def strsxp(blob):
    assert blob[:2] == b'X\n'
    p = 2
    ver, = struct.unpack('>i', blob[p:p + 4]); p += 12
    if ver == 3:
        nel, = struct.unpack('>i', blob[p:p + 4]); p += 4 + nel
    flags, = struct.unpack('>i', blob[p:p + 4]); p += 4
    if flags & 0xff != 16:
        return None
    count, = struct.unpack('>i', blob[p:p + 4]); p += 4
    lines = []
    for _ in range(count):
        cf, ln = struct.unpack('>ii', blob[p:p + 8]); p += 8
        assert cf & 0xff == 9
        if ln < 0:
            lines.append(None); continue
        lines.append(blob[p:p + ln].decode('utf-8')); p += ln
    return lines

if __name__ == '__main__':
    for i, blob in enumerate(records(sys.argv[1])):
        v = strsxp(blob)
        if v is None:
            print(i, 'not a character vector', file=sys.stderr); continue
        head = next((l for l in v if l and l.strip()), '')
        print(i, len(v), sum(len(l or '') for l in v), repr(head[:60]), file=sys.stderr)
        if len(sys.argv) > 2:
            with open(f'{sys.argv[2]}/novel{i}.txt', 'w', encoding='utf-8') as f:
                f.write('\n'.join(l or '' for l in v) + '\n')
