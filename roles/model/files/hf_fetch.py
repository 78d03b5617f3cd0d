"""Fetch files of one Hub repository with huggingface_hub; write their manifest.

Run by role `model` with the ml-env's python, in the background (async), while the role
prints the progress file (--progress) every round. The token comes from --token-file,
which this script reads and removes at once (the role writes it root-only just before,
under no_log: never on a command line, in the task's arguments or in the environment,
which -vvv prints), or from HF_TOKEN. Resumable: huggingface_hub keeps partial
downloads under <local-dir>/.cache/huggingface and continues them with a Range request;
one fetch at a time per directory (--lock): a second one (a rerun while the fetch of a
killed run still goes on) waits for the first and then finds its files in place.

Progress (--progress, JSON, rewritten every --interval seconds): files and bytes present
of the total (complete files and partial downloads), the rate over the last minute, the
time left at that rate, the files in flight, and at the start what was already there
(a resumed fetch). Key ``line`` is one sentence for the operator.

Prints one JSON line on stdout and nothing else there:
  {"changed": bool, "revision": sha, "files": n, "bytes": n, "downloaded": n,
   "manifest_written": bool}
or, on any failure, {"failed": true, "msg": "<one line, never the token>"} (rc 1).

The manifest lists {path, size, sha256} of every fetched file: the Hub's LFS sha256
for large files; for small (git) files the sha256 of the local copy once its git
blob id has been checked against the Hub's (blobId); a small file whose blob id differs
is fetched again, and one the hub gives no digest for is refused. The manifest thus
comes only from what the hub says, never from what the disk holds unchecked.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import fnmatch
import glob
import hashlib
import json
import os
import shutil
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
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


class Progress:
    """Measures the fetch from the disk (complete files, huggingface_hub's partial
    downloads named <hash>.<etag>.incomplete) and rewrites the progress file: the
    document of role glm5's module_utils/glm5_progress.py, which the role puts in words."""

    WINDOW_S = 60.0

    def __init__(self, path: str, interval: float, repo: str, local: Path) -> None:
        self.path = Path(path) if path else None
        self.interval = max(0.2, interval)
        self.repo = repo
        self.local = local
        self.entries: list[dict[str, Any]] = []
        self.etags: dict[str, dict[str, Any]] = {}
        self.started = time.time()
        self.samples: deque[tuple[float, int]] = deque()
        self.resumed: tuple[int, int, int] = (0, 0, 0)
        self.note = "reading the repository's file list"
        self.nothing_to_do = False
        self.done = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def plan(self, entries: list[dict[str, Any]], etags: dict[str, dict[str, Any]]) -> None:
        self.entries, self.etags = entries, etags
        present, complete, in_flight = self.measure()
        self.resumed = (present, complete, len(in_flight))
        self.samples.append((time.monotonic(), present))

    def measure(self) -> tuple[int, int, list[dict[str, Any]]]:
        """(bytes present, complete files, [{path, bytes, size}] of the partial ones)."""
        partial: dict[str, int] = {}
        download = self.local / ".cache" / "huggingface" / "download"
        if download.is_dir():
            for inc in download.rglob("*.incomplete"):
                entry = self.etags.get(inc.name[: -len(".incomplete")].rpartition(".")[2])
                if entry is not None:
                    with contextlib.suppress(OSError):
                        partial[entry["path"]] = max(partial.get(entry["path"], 0), inc.stat().st_size)
        present, complete = 0, 0
        in_flight: list[dict[str, Any]] = []
        for e in self.entries:
            try:
                size = (self.local / e["path"]).stat().st_size
            except OSError:
                size = -1
            if size == int(e["size"]):
                present += size
                complete += 1
            elif e["path"] in partial:
                present += partial[e["path"]]
                in_flight.append({"path": e["path"], "bytes": partial[e["path"]], "size": int(e["size"])})
        return present, complete, in_flight

    def document(self) -> dict[str, Any]:
        present, complete, in_flight = self.measure()
        now = time.monotonic()
        self.samples.append((now, present))
        while len(self.samples) > 2 and now - self.samples[1][0] >= self.WINDOW_S:
            self.samples.popleft()
        t0, b0 = self.samples[0]
        return {"what": self.repo, "pid": os.getpid(), "done": self.done, "updated": time.time(),
                "elapsed": time.time() - self.started,
                "files_done": complete, "files_total": len(self.entries), "bytes_done": present,
                "bytes_total": sum(int(e["size"]) for e in self.entries),
                "rate": (present - b0) / (now - t0) if now > t0 else 0.0, "current": in_flight,
                "note": "" if in_flight else self.note, "resumed_bytes": self.resumed[0],
                "resumed_files": self.resumed[1], "resumed_partial": self.resumed[2],
                "nothing_to_do": self.nothing_to_do}

    def write(self) -> None:
        if self.path is None:
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.document()) + "\n")
        tmp.replace(self.path)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with contextlib.suppress(OSError):
                self.write()

    def start(self) -> None:
        if self.path is not None:
            with contextlib.suppress(OSError):
                self.write()
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()

    def stop(self, done: bool) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self.done = done
        with contextlib.suppress(OSError):
            self.write()


@contextlib.contextmanager
def locked(path: str) -> Iterator[None]:
    """One fetch at a time per directory; a second one waits for the first."""
    if not path:
        yield
        return
    with open(path, "a+") as fh:  # noqa: PTH123 - flock needs the file object
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            # The progress file is the running fetch's meanwhile: the role shows its progress.
            fcntl.flock(fh, fcntl.LOCK_EX)
        fh.seek(0)
        fh.truncate()
        fh.write(f"{os.getpid()}\n")
        fh.flush()
        yield


def fetch(args: argparse.Namespace, token: str | None, progress: Progress) -> dict[str, Any]:
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
    etags: dict[str, dict[str, Any]] = {}
    for sib in info.siblings or []:
        if not any(fnmatch.fnmatch(sib.rfilename, p) for p in patterns):
            continue
        if sib.size is None:
            raise FetchError(f"{args.repo}: the hub sent no size for {sib.rfilename}")
        sha = sib.lfs.sha256 if sib.lfs is not None else None
        if sha is None and sib.blob_id is None:
            raise FetchError(f"{args.repo}: the hub sent no digest (LFS sha256 or git blob id) for {sib.rfilename};"
                             " it cannot be verified")
        entries.append({"path": sib.rfilename, "size": sib.size, "sha256": sha})
        blob_ids[sib.rfilename] = sib.blob_id
        etags[sha or str(sib.blob_id)] = entries[-1]
    if not entries:
        raise FetchError(f"{args.repo}@{args.revision}: no file matches {patterns}")
    local = Path(args.local_dir)
    if not local.is_dir():
        raise FetchError(f"{local} is not a directory")
    progress.plan(entries, etags)
    # A small (git) file whose blob id differs from the hub's is fetched again (a large
    # one's sha256 is the role's verification's, which removes a file that differs).
    for e in entries:
        path = local / e["path"]
        if e["sha256"] is None and path.is_file() and path.stat().st_size == e["size"]:
            _sha, oid = digests(path)
            if oid != blob_ids[e["path"]]:
                path.unlink()
    missing = [e for e in entries if not (local / e["path"]).is_file()
               or (local / e["path"]).stat().st_size != e["size"]]
    need = sum(int(e["size"]) for e in missing)
    free = shutil.disk_usage(local).free
    if need and free < need + args.headroom:
        raise FetchError(f"{local}: {free} bytes free, {need} needed for {len(missing)} files"
                         f" + {args.headroom} headroom (model_disk_headroom_bytes); nothing downloaded")
    progress.note = "downloading"
    if not missing:
        progress.resumed = (0, 0, 0)
        progress.nothing_to_do = True
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
            if oid != blob_ids[e["path"]]:
                raise FetchError(f"{path}: git blob id {oid} after the download, the hub says {blob_ids[e['path']]}")
            e["sha256"] = sha256
    manifest = Path(args.manifest)
    text = json.dumps(entries, indent=1, sort_keys=True) + "\n"
    old = manifest.read_text() if manifest.is_file() else None
    if old != text:
        manifest.write_text(text)
    return {"changed": bool(missing) or old != text, "revision": info.sha, "files": len(entries),
            "bytes": sum(int(e["size"]) for e in entries), "downloaded": len(missing),
            "manifest_written": old != text}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repo", required=True)
    parser.add_argument("--revision", default="main")
    parser.add_argument("--local-dir", required=True)
    parser.add_argument("--manifest", required=True)
    parser.add_argument("--allow-patterns", required=True, help="JSON list of globs")
    parser.add_argument("--headroom", type=int, default=0)
    parser.add_argument("--token-file", default="", help="read the token from here, then remove the file")
    parser.add_argument("--progress", default="", help="progress file (JSON) to rewrite while fetching")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between progress writes")
    parser.add_argument("--lock", default="", help="lock file: one fetch at a time")
    args = parser.parse_args()
    token = os.environ.get("HF_TOKEN") or None
    progress = Progress(args.progress, args.interval, args.repo, Path(args.local_dir))
    ok = False
    try:
        if args.token_file:
            token_path = Path(args.token_file)
            try:
                token = token_path.read_text().strip() or None
            finally:
                token_path.unlink(missing_ok=True)
        with locked(args.lock):
            progress.start()
            result = fetch(args, token, progress)
            ok = True
    except FetchError as exc:
        result = {"failed": True, "msg": str(exc)}
    except Exception as exc:  # one clear line for the role instead of a traceback
        result = {"failed": True, "msg": f"{args.repo}: {one_line(exc)}"}
    finally:
        progress.stop(done=ok)
    if token and "msg" in result:
        result["msg"] = str(result["msg"]).replace(token, "***")
    print(json.dumps(result))
    return 1 if result.get("failed") else 0


if __name__ == "__main__":
    sys.exit(main())
