"""Issue 23 item 3: llama.cpp's logits of run 5's held prompts on a fixture GGUF, as one
small file for the GPU machine (which has no llama.cpp): compare_fp8.py --oracle-npz.

usage (here): PYTHONPATH=src .venv-ml/bin/python docs/validation/e2e-gpu/fp8/oracle_npz.py GGUF OUT.npz
OUT.npz: ll<k> = llama.cpp's logits [n_tokens - 1, vocab] float32 of prompt k (the
positions query5.py's prompt log-probs cover), index_topk, and the GGUF's sha256.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np

from glm5_tools.diagnostics.dsa_reference import GlmDsaReference
from glm5_tools.diagnostics.stage_sparse import llama_cpp_logits

HERE = Path(__file__).resolve().parent


def main() -> None:
    gguf, out = Path(sys.argv[1]), Path(sys.argv[2])
    prompts = json.loads((HERE.parent / "run5" / "prompts.json").read_text())
    arrays = {f"ll{k}": llama_cpp_logits(gguf, p["ids"])[: len(p["ids"]) - 1].numpy().astype(np.float32)
              for k, p in enumerate(prompts)}
    arrays["index_topk"] = np.array(GlmDsaReference(gguf).hp.index_topk)
    arrays["gguf_sha256"] = np.array(hashlib.sha256(gguf.read_bytes()).hexdigest())
    np.savez_compressed(out, **arrays)
    print(out, {k: v.shape for k, v in arrays.items()})


if __name__ == "__main__":
    main()
