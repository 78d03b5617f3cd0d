# Prints "pristine" when vLLM's patched files match the hashes of the wheel's RECORD.
import base64
import hashlib
import pathlib
import sys

site = pathlib.Path(sys.argv[1])
wanted = {
    "vllm/transformers_utils/config.py",
    "vllm/model_executor/model_loader/gguf_loader.py",
    "vllm/model_executor/model_loader/weight_utils.py",
    "vllm/model_executor/models/deepseek_v2.py",
}
record = next(site.glob("vllm-*.dist-info")) / "RECORD"
bad = []
for line in record.read_text().splitlines():
    path, digest, _size = line.rsplit(",", 2)
    if path in wanted:
        raw = hashlib.sha256((site / path).read_bytes()).digest()
        if digest != "sha256=" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode():
            bad.append(path)
        wanted.discard(path)
print("pristine" if not bad and not wanted else "modified: " + " ".join(bad + sorted(wanted)))
