"""Write a synthetic glm-dsa GGUF at GLM-5's real dimensions (2 layers: one dense, one
MoE with 2 experts; tiny vocabulary) and its config.json, for stage 4 at TP 8."""

import json
import sys
import time
from pathlib import Path

from glm5_tools.diagnostics.synthetic import write_gguf
from glm5_tools.fixtures.tiny_config import REAL_GLM5

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
cfg = {**REAL_GLM5, "model_type": "glm_moe_dsa", "num_hidden_layers": 2, "first_k_dense_replace": 1,
       "n_routed_experts": 2, "num_experts_per_tok": 1, "vocab_size": 256, "num_nextn_predict_layers": 0,
       "tie_word_embeddings": False}
(out / "config.json").write_text(json.dumps(cfg, indent=1))
t = time.time()
write_gguf(cfg, out / "glm5dims.gguf")
print(f"wrote {out / 'glm5dims.gguf'} ({(out / 'glm5dims.gguf').stat().st_size >> 20} MiB) in {time.time() - t:.1f} s")
