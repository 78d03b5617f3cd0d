"""Regenerate the tiny fixture's bf16 safetensors on the GPU machine (seeded: same bytes)."""
import hashlib
import json
import sys
from pathlib import Path

from glm5_tools.fixtures.weights import save_checkpoint

hf, out = Path(sys.argv[1]), Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
names = save_checkpoint(json.loads((hf / "config.json").read_text()), out)
for n in sorted(p.name for p in out.iterdir()):
    print(hashlib.sha256((out / n).read_bytes()).hexdigest(), n)
print("done")
