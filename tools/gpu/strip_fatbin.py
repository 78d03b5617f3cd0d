"""Zero the device code of a CUDA shared library's fatbins except one SM's cubins.

usage: python strip_fatbin.py SRC DST SM   (e.g. SM 90)
For carrying vLLM's 88 MB _C.abi3.so to the GPU machine in one call: the cubins
(ELF entries) for other SMs are overwritten with zeros in place (file layout and
sizes unchanged), so the file compresses to ~26 MB; PTX entries are kept. Each
fatbin (magic 0xBA55ED50, 16-byte header) is parsed entry by entry and left
untouched unless its entries tile it exactly.
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

MAGIC = struct.pack("<I", 0xBA55ED50)
PTX, ELF = 1, 2


def strip(data: bytearray, keep_sm: int) -> tuple[int, int]:
    pos, fatbins, zeroed = 0, 0, 0
    while (i := data.find(MAGIC, pos)) >= 0:
        _ver, hsz, fsz = struct.unpack_from("<HHQ", data, i + 4)
        end = i + 16 + fsz
        if hsz != 16 or fsz == 0 or end > len(data):
            pos = i + 4
            continue
        entries, e = [], i + 16
        while e < end:
            kind, _ev, ehs, padded = struct.unpack_from("<HHII", data, e)
            sm = struct.unpack_from("<I", data, e + 28)[0]
            if kind not in (PTX, ELF) or not 64 <= ehs <= 256 or e + ehs + padded > end:
                break
            entries.append((kind, sm, e + ehs, padded))
            e += ehs + padded
        if e != end:
            pos = i + 4
            continue
        fatbins += 1
        for kind, sm, start, size in entries:
            if kind == ELF and sm != keep_sm:
                data[start : start + size] = bytes(size)
                zeroed += size
        pos = end
    return fatbins, zeroed


def main() -> None:
    src, dst, keep = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    data = bytearray(src.read_bytes())
    fatbins, zeroed = strip(data, keep)
    dst.write_bytes(data)
    print(f"{fatbins} fatbins, {zeroed / 1e6:.1f} MB of other SMs' cubins zeroed")


if __name__ == "__main__":
    main()
