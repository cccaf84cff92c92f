"""Convert a quantized GGUF to F16 with gguf-py: the same weights (dequantized), more bytes.

    python scripts/to_f16.py IN.gguf OUT.gguf

Every metadata key is copied as it is; every 2-D or larger tensor is dequantized
(gguf.quants.dequantize) and written as F16, 1-D ones (norms, biases) as F32. The benchmark of
a draft model (scripts/bench_spec.py --draft) drafts with IN for OUT: same vocabulary, same
predictions up to rounding, ~2.75x the bytes per token for a Q4_1 IN.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize


def convert(src: Path, dst: Path) -> None:
    reader = GGUFReader(src)
    arch = str(reader.fields["general.architecture"].contents())
    writer = GGUFWriter(dst, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        if name == "general.file_type":
            writer.add_key_value(name, 1, vtype)  # LLAMA_FTYPE_MOSTLY_F16
            continue
        writer.add_key_value(name, field.contents(), vtype, sub)
    for t in reader.tensors:
        rows = dequantize(t.data, t.tensor_type).astype(np.float32)
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))   # numpy order
        rows = rows.reshape(shape)
        writer.add_tensor(t.name, rows.astype(np.float16) if rows.ndim > 1 else rows,
                          raw_dtype=GGMLQuantizationType.F16 if rows.ndim > 1 else None)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    convert(Path(sys.argv[1]), Path(sys.argv[2]))
