#!/usr/bin/python
"""Ansible module: find the GGUF path vLLM 0.20.2 wants and read the base config."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: glm5_model_layout
short_description: Locate the first GGUF shard, the chat template and the head count
description:
  - vLLM 0.20.2's GGUF loader is given one file; for split files it is the first shard
    (C(*-00001-of-000NN.gguf)) and the loader discovers the others beside it
    (GGUFModelLoader._get_all_gguf_files). This module returns that first shard after
    checking that every shard of the set is present. Read-only.
options:
  model_dir: {description: Model directory (gguf/ and base/ below it)., type: path, required: true}
  quant: {description: Quant name the shard file names contain., type: str, required: true}
author: glm5-deploy
"""

EXAMPLES = r"""
- glm5_model_layout:
    model_dir: /srv/models/glm-5
    quant: UD-Q4_K_XL
"""

RETURN = r"""
gguf_path: {description: The file to pass to vLLM (first shard)., type: str, returned: success}
gguf_files: {description: All shards., type: list, returned: success}
chat_template: {description: The base repository's chat template file ("" if none)., type: str, returned: success}
num_attention_heads: {description: From base/config.json (0 if absent)., type: int, returned: success}
index_topk: {description: From base/config.json (0 if absent)., type: int, returned: success}
"""

SHARD = re.compile(r"-(\d+)-of-(\d+)\.gguf$")


def pick_gguf(files: list[Path]) -> tuple[Path, list[Path]]:
    """The first shard of the one shard set (or the single file) among ``files``."""
    if not files:
        raise ValueError("no GGUF file found")
    sharded = [f for f in files if SHARD.search(f.name)]
    if not sharded:
        if len(files) != 1:
            raise ValueError(f"{len(files)} unsharded GGUF files; expected one")
        return files[0], files
    sets: dict[str, list[Path]] = {}
    for f in sharded:
        sets.setdefault(str(f.parent / SHARD.sub("", f.name)), []).append(f)
    if len(sets) != 1 or len(sharded) != len(files):
        raise ValueError(f"several GGUF sets found: {sorted(sets)}")
    shards = sorted(sharded)
    m = SHARD.search(shards[0].name)
    assert m is not None
    total = int(m.group(2))
    indices = sorted(int(SHARD.search(f.name).group(1)) for f in shards)  # type: ignore[union-attr]
    if indices != list(range(1, total + 1)):
        raise ValueError(f"shards {indices} of {total} present")
    return shards[0], shards


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "model_dir": {"type": "path", "required": True},
            "quant": {"type": "str", "required": True},
        },
        supports_check_mode=True,
    )
    root = Path(module.params["model_dir"])
    quant = module.params["quant"]
    files = sorted(p for p in (root / "gguf").rglob("*.gguf") if quant in p.name)
    try:
        first, shards = pick_gguf(files)
    except ValueError as exc:
        module.fail_json(msg=f"{root}/gguf, quant {quant}: {exc}")
    base = root / "base"
    config: dict[str, Any] = {}
    try:
        config = json.loads((base / "config.json").read_text())
    except (OSError, ValueError) as exc:
        module.fail_json(msg=f"{base}/config.json: {exc}")
    template = base / "chat_template.jinja"
    module.exit_json(
        changed=False,
        gguf_path=str(first),
        gguf_files=[str(s) for s in shards],
        chat_template=str(template) if template.is_file() else "",
        num_attention_heads=int(config.get("num_attention_heads") or 0),
        index_topk=int(config.get("index_topk") or 0),
    )


if __name__ == "__main__":
    main()
