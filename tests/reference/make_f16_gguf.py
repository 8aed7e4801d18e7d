#!/usr/bin/env python3
"""Writes the "FP16 reference model" of a quantized GGUF as a plain F16 GGUF.

pdq's FP16 reference model is: every quantized weight tensor (Q4_1, Q8_0, ...)
dequantized and rounded to FP16, while F32 tensors (the norm weights) stay F32.
This script builds exactly that model as a standalone GGUF file so that an
independent engine (llama.cpp, via llama-cpp-python; see
compare_llama_cpp.py) can run it. Dequantization uses the `gguf` Python
package's numpy code (gguf.quants.dequantize), which is independent of both
ggml's C code and pdq's.

All key/value metadata (including the tokenizer arrays and chat template) is
copied unchanged, except general.file_type, which is set to MOSTLY_F16.

Run (needs the `gguf` and `numpy` packages):
    python3 tests/reference/make_f16_gguf.py \
        [models/SmolLM2-135M-Instruct.Q4_1.gguf] [/tmp/smollm2-f16.gguf]
"""
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

KEEP_AS_IS = {T.F32, T.F16}


def main() -> None:
    src = sys.argv[1] if len(sys.argv) > 1 else "models/SmolLM2-135M-Instruct.Q4_1.gguf"
    dst = sys.argv[2] if len(sys.argv) > 2 else "/tmp/smollm2-f16.gguf"

    reader = gguf.GGUFReader(src)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(dst, arch=arch, endianess=reader.endianess)

    n_kv = 0
    for field in reader.fields.values():
        # Virtual GGUF.* fields and general.architecture are written by GGUFWriter.
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = field.contents()
        if field.name == gguf.Keys.General.FILE_TYPE:
            value = int(gguf.LlamaFileType.MOSTLY_F16)
        writer.add_key_value(field.name, value, vtype, sub_type=sub_type)
        n_kv += 1

    counts: dict[str, int] = {}
    for t in reader.tensors:
        qtype = T(t.tensor_type)
        if qtype in KEEP_AS_IS:
            data = np.array(t.data)  # already numpy order (rows, cols)
        else:
            data = dequantize(t.data, qtype).astype(np.float16)
        # GGUF stores ne[0] (the contiguous dim) first; numpy shape is reversed.
        expect = tuple(int(x) for x in reversed(t.shape))
        assert data.shape == expect or data.reshape(expect).shape == expect, (t.name, data.shape, expect)
        data = data.reshape(expect)
        writer.add_tensor(t.name, data)
        key = f"{qtype.name}->{data.dtype}"
        counts[key] = counts.get(key, 0) + 1

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"wrote {dst}: {n_kv} kv fields, {len(reader.tensors)} tensors {counts}")


if __name__ == "__main__":
    main()
