"""Fetch files of one Hub repository with huggingface_hub; write their manifest.

Run by role `model` with the ml-env's python. The token comes from HF_TOKEN (the
role writes it to the stdin of a shell that exports it, under no_log: never on a
command line, which -vvv would print). Resumable: huggingface_hub keeps
partial downloads under <local-dir>/.cache/huggingface and continues them with a
Range request.

Prints one JSON line on stdout and nothing else there:
  {"changed": bool, "revision": sha, "files": n, "bytes": n, "downloaded": n}
or, on any failure, {"failed": true, "msg": "<one line, never the token>"} (rc 1).

The manifest lists {path, size, sha256} of every fetched file: the Hub's LFS sha256
for large files; for small (git) files the sha256 of the local copy once its git
blob id has been checked against the Hub's (blobId).
"""

from __future__ import annotations

import argparse
import fnmatch
import glob
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

from huggingface_hub import HfApi, snapshot_download  # after the settings above: read at import
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

CHUNK = 1 << 20


class FetchError(Exception):
    """A failure with a message for the operator."""


def digests(path: Path) -> tuple[str, str]:
    """(sha256, git blob id) of a local file."""
    sha = hashlib.sha256()
    oid = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK):
            sha.update(chunk)
            oid.update(chunk)
    return sha.hexdigest(), oid.hexdigest()


def one_line(exc: BaseException) -> str:
    """The first line of an exception's text with its type name, e.g. for HTTP errors."""
    text = " ".join(str(exc).split("\n\n")[0].split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def fetch(args: argparse.Namespace, token: str | None) -> dict[str, Any]:
    patterns: list[str] = json.loads(args.allow_patterns)
    api = HfApi(token=token)
    try:
        info = api.model_info(args.repo, revision=args.revision, files_metadata=True)
    except GatedRepoError as exc:
        how = "without a token (set model_hf_token)" if token is None else "with this token (model_hf_token)"
        raise FetchError(f"{args.repo} is gated: the hub refused access {how} ({one_line(exc)});"
                         " request access on the hub and use a token of that account") from exc
    except RevisionNotFoundError as exc:
        raise FetchError(f"{args.repo}: revision {args.revision} not found") from exc
    except RepositoryNotFoundError as exc:
        raise FetchError(f"{args.repo}: repository not found, or not visible with this token") from exc
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        if status == 401:
            raise FetchError(f"{args.repo}: the hub rejected the token (model_hf_token): {one_line(exc)}") from exc
        raise FetchError(f"{args.repo}: hub error: {one_line(exc)}") from exc
    entries: list[dict[str, Any]] = []
    blob_ids: dict[str, str | None] = {}
    for sib in info.siblings or []:
        if not any(fnmatch.fnmatch(sib.rfilename, p) for p in patterns):
            continue
        if sib.size is None:
            raise FetchError(f"{args.repo}: the hub sent no size for {sib.rfilename}")
        sha = sib.lfs.sha256 if sib.lfs is not None else None
        entries.append({"path": sib.rfilename, "size": sib.size, "sha256": sha})
        blob_ids[sib.rfilename] = sib.blob_id
    if not entries:
        raise FetchError(f"{args.repo}@{args.revision}: no file matches {patterns}")
    local = Path(args.local_dir)
    if not local.is_dir():
        raise FetchError(f"{local} is not a directory")
    missing = [e for e in entries if not (local / e["path"]).is_file()
               or (local / e["path"]).stat().st_size != e["size"]]
    need = sum(int(e["size"]) for e in missing)
    free = shutil.disk_usage(local).free
    if need and free < need + args.headroom:
        raise FetchError(f"{local}: {free} bytes free, {need} needed for {len(missing)} files"
                         f" + {args.headroom} headroom (model_disk_headroom_bytes); nothing downloaded")
    if missing:
        try:
            snapshot_download(repo_id=args.repo, revision=info.sha, local_dir=str(local),
                              allow_patterns=[glob.escape(e["path"]) for e in missing], token=token)
        except HfHubHTTPError as exc:
            raise FetchError(f"{args.repo}: download failed: {one_line(exc)}") from exc
        except OSError as exc:
            raise FetchError(f"{args.repo}: download failed (run again to resume): {one_line(exc)}") from exc
    for e in entries:
        path = local / e["path"]
        if not path.is_file() or path.stat().st_size != e["size"]:
            raise FetchError(f"{path}: not {e['size']} bytes after the download")
        if e["sha256"] is None:
            sha256, oid = digests(path)
            if blob_ids[e["path"]] is not None and oid != blob_ids[e["path"]]:
                raise FetchError(f"{path}: git blob id {oid}, the hub says {blob_ids[e['path']]}")
            e["sha256"] = sha256
    manifest = Path(args.manifest)
    text = json.dumps(entries, indent=1, sort_keys=True) + "\n"
    old = manifest.read_text() if manifest.is_file() else None
    if old != text:
        manifest.write_text(text)
    return {"changed": bool(missing) or old != text, "revision": info.sha, "files": len(entries),
            "bytes": sum(int(e["size"]) for e in entries), "downloaded": len(missing)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repo", required=True)
    parser.add_argument("--revision", default="main")
    parser.add_argument("--local-dir", required=True)
    parser.add_argument("--manifest", required=True)
    parser.add_argument("--allow-patterns", required=True, help="JSON list of globs")
    parser.add_argument("--headroom", type=int, default=0)
    args = parser.parse_args()
    token = os.environ.get("HF_TOKEN") or None
    try:
        result = fetch(args, token)
    except FetchError as exc:
        result = {"failed": True, "msg": str(exc)}
    except Exception as exc:  # one clear line for the role instead of a traceback
        result = {"failed": True, "msg": f"{args.repo}: {one_line(exc)}"}
    if token and "msg" in result:
        result["msg"] = str(result["msg"]).replace(token, "***")
    print(json.dumps(result))
    return 1 if result.get("failed") else 0


if __name__ == "__main__":
    sys.exit(main())
