"""Reading the deployed GGUF (one file or the shards of a split model) with gguf-py."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

FLOAT_TYPES = (0, 1, 30)  # GGML F32, F16, BF16: stored as values, nothing to dequantize


@dataclass
class GGUFTensor:
    name: str
    qtype: int  # GGMLQuantizationType value
    shape: tuple[int, ...]  # numpy order (outermost first), dequantized shape
    raw: np.ndarray  # the bytes (quantized) or values (float types), as gguf-py maps them

    @property
    def type_name(self) -> str:
        import gguf

        return str(gguf.GGMLQuantizationType(self.qtype).name)


def gguf_files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted(path.glob("*.gguf"))
        if not files:
            raise FileNotFoundError(f"no .gguf file in {path}")
        return files
    if not path.exists():
        raise FileNotFoundError(path)
    stem = path.name
    # name-00001-of-00009.gguf: take every shard beside it
    if "-of-" in stem and stem.endswith(".gguf"):
        prefix = stem.rsplit("-", 3)[0]
        return sorted(path.parent.glob(f"{prefix}-*-of-*.gguf"))
    return [path]


def read_tensors(path: Path) -> tuple[dict[str, GGUFTensor], dict[str, Any]]:
    """All tensors (memory-mapped, nothing copied) and the scalar metadata."""
    import gguf

    tensors: dict[str, GGUFTensor] = {}
    meta: dict[str, Any] = {}
    for file in gguf_files(path):
        reader = gguf.GGUFReader(str(file))
        for key, fld in reader.fields.items():
            if key.startswith("GGUF.") or not fld.types:
                continue
            if fld.types[0] == gguf.GGUFValueType.STRING:
                meta[key] = bytes(fld.parts[fld.data[0]]).decode("utf-8", "replace")
            elif fld.types[0] != gguf.GGUFValueType.ARRAY:
                meta[key] = fld.parts[fld.data[0]].tolist()[0]
        for t in reader.tensors:
            shape = tuple(int(d) for d in reversed(t.shape.tolist()))
            tensors[t.name] = GGUFTensor(t.name, int(t.tensor_type), shape, t.data)
    return tensors, meta


def block_info(qtype: int) -> tuple[int, int]:
    """(elements per block, bytes per block)."""
    import gguf

    size: tuple[int, int] = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(qtype)]
    return size


def rows_view(t: GGUFTensor) -> np.ndarray:
    """The raw data as [rows, bytes-or-values of one row]: each row is self-contained."""
    raw = t.raw
    return raw.reshape(-1, raw.shape[-1])


def dequantize_rows(t: GGUFTensor, rows: np.ndarray) -> np.ndarray:
    """gguf-py's CPU reference dequantization of some raw rows, float32 [n, row_len]."""
    import gguf

    out = gguf.quants.dequantize(np.ascontiguousarray(rows), gguf.GGMLQuantizationType(t.qtype))
    return np.asarray(out, dtype=np.float32).reshape(rows.shape[0], -1)


def dequantize_full(t: GGUFTensor) -> np.ndarray:
    return dequantize_rows(t, rows_view(t)).reshape(t.shape)
