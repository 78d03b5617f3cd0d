"""Fetch files of one Hub repository with huggingface_hub; write their manifest.

Run by role `model` with the ml-env's python. The token comes from HF_TOKEN (the
role passes it by environment, under no_log). Resumable: huggingface_hub keeps
partial downloads under <local-dir>/.cache/huggingface and continues them.
Prints one JSON line: {"changed": bool, "revision": sha, "files": n, "bytes": n}.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shutil
import sys
from pathlib import Path

from huggingface_hub import HfApi, snapshot_download


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repo", required=True)
    parser.add_argument("--revision", default="main")
    parser.add_argument("--local-dir", required=True)
    parser.add_argument("--manifest", required=True)
    parser.add_argument("--allow-patterns", required=True, help="JSON list of globs")
    parser.add_argument("--headroom", type=int, default=0)
    args = parser.parse_args()
    patterns: list[str] = json.loads(args.allow_patterns)
    token = os.environ.get("HF_TOKEN") or None
    api = HfApi(token=token)
    info = api.model_info(args.repo, revision=args.revision, files_metadata=True)
    entries = []
    for sib in info.siblings or []:
        if not any(fnmatch.fnmatch(sib.rfilename, p) for p in patterns):
            continue
        sha = sib.lfs.sha256 if sib.lfs is not None else None
        entries.append({"path": sib.rfilename, "size": sib.size, "sha256": sha})
    if not entries:
        print(json.dumps({"failed": True, "msg": f"{args.repo}: no file matches {patterns}"}))
        return 1
    local = Path(args.local_dir)
    missing = [e for e in entries if not (local / e["path"]).is_file()
               or (local / e["path"]).stat().st_size != e["size"]]
    need = sum(int(e["size"] or 0) for e in missing)
    free = shutil.disk_usage(local).free
    if need and free < need + args.headroom:
        print(json.dumps({"failed": True, "msg": f"{local}: {free} bytes free, {need} needed"
                          f" + {args.headroom} headroom"}))
        return 1
    if missing:
        snapshot_download(
            repo_id=args.repo,
            revision=info.sha,
            local_dir=str(local),
            allow_patterns=patterns,
            token=token,
        )
    manifest = Path(args.manifest)
    text = json.dumps(entries, indent=1, sort_keys=True) + "\n"
    old = manifest.read_text() if manifest.is_file() else None
    if old != text:
        manifest.write_text(text)
    total = sum(int(e["size"] or 0) for e in entries)
    changed = bool(missing) or old != text
    print(json.dumps({"changed": changed, "revision": info.sha, "files": len(entries),
                      "bytes": total}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
