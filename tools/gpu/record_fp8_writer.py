"""Record the bytes vLLM's own fp8_ds_mla cache writer (concat_and_cache_mla, CUDA) writes
for a fixed input, so that CI can compare stage 8's CPU writer with them byte for byte.

usage (repository root, on the GPU validation machine):
    PYTHONPATH=src python3 tools/gpu/record_fp8_writer.py SITE_DIR OUT_DIR

SITE_DIR holds vLLM 0.20.2's compiled ``_C.abi3.so`` (loaded with
``torch.ops.load_library``, so no other part of vLLM is imported; a site-packages
directory with vLLM installed works too: its ``vllm/_C.abi3.so``). The
input is ``glm5_tools.diagnostics.fp8_ds_mla.probe_input()`` (deterministic, made on the
CPU). Writes into OUT_DIR:

* ``fp8_ds_mla_writer.bin``: the whole uint8 cache [2, 64, 656] after the op (zeros where
  no token was written), 83,968 bytes;
* ``fp8_ds_mla_writer.json``: the input's and the output's sha256, the cache shape, the
  device, torch's and CUDA's versions, and how many rows the CPU writer (run here too)
  writes identically.

Commit both under devtests/ml/forward/gpu_records/; the test
devtests/ml/forward/test_fp8_ds_mla_writer.py then compares the CPU writer with them.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import torch

from glm5_tools.diagnostics import fp8_ds_mla


def input_digest(kv_c: torch.Tensor, k_pe: torch.Tensor, slots: torch.Tensor) -> str:
    h = hashlib.sha256()
    for t in (kv_c.view(torch.int16), k_pe.view(torch.int16), slots):
        h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()


def main() -> None:
    site, out = Path(sys.argv[1]), Path(sys.argv[2])
    lib = site / "_C.abi3.so"
    if not lib.exists():
        lib = site / "vllm" / "_C.abi3.so"
    torch.ops.load_library(str(lib))
    kv_c, k_pe, slots, shape = fp8_ds_mla.probe_input()
    dev = torch.device("cuda")
    cache = torch.zeros(shape, dtype=torch.uint8, device=dev)
    torch.ops._C_cache_ops.concat_and_cache_mla(
        kv_c.to(dev), k_pe.to(dev), cache, slots.to(dev), "fp8_ds_mla", torch.ones(1, device=dev)
    )
    torch.cuda.synchronize()
    gpu = cache.cpu()
    mine = torch.zeros(shape, dtype=torch.uint8)
    fp8_ds_mla.write(kv_c, k_pe, mine, slots)
    same_rows = (gpu.view(-1, shape[-1]) == mine.view(-1, shape[-1])).all(-1)
    out.mkdir(parents=True, exist_ok=True)
    data = gpu.numpy().tobytes()
    (out / "fp8_ds_mla_writer.bin").write_bytes(data)
    report = {
        "op": "torch.ops._C_cache_ops.concat_and_cache_mla(kv_c, k_pe, cache, slots, 'fp8_ds_mla', ones(1))",
        "library": str(lib),
        "input": "glm5_tools.diagnostics.fp8_ds_mla.probe_input()",
        "input_sha256": input_digest(kv_c, k_pe, slots),
        "cache_shape": list(shape),
        "output_sha256": hashlib.sha256(data).hexdigest(),
        "device": torch.cuda.get_device_name(dev),
        "capability": list(torch.cuda.get_device_capability(dev)),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cpu_writer_rows_equal": int(same_rows.sum()),
        "rows": int(same_rows.numel()),
    }
    (out / "fp8_ds_mla_writer.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
