"""The test double itself (fake_hf_hub): the answers huggingface_hub relies on, checked
at the HTTP level, so that a test of hf_fetch.py cannot pass on a double that is wrong."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from email.message import Message

import pytest
from conftest import BASE_REPO, GGUF_REPO, QUANT, TOKEN, Hub


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


def _call(url: str, method: str = "GET", token: str | None = TOKEN,
          headers: dict[str, str] | None = None) -> tuple[int, Message, bytes]:
    req = urllib.request.Request(url, method=method, headers=dict(headers or {}))
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(req, timeout=30) as resp:
            return resp.status, resp.headers, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read()


def test_model_info_sha_is_deterministic_and_lists_lfs(hub: Hub) -> None:
    status, _, body = _call(f"{hub.url}/api/models/{GGUF_REPO}/revision/main?blobs=true")
    assert status == 200
    doc = json.loads(body)
    again = json.loads(_call(f"{hub.url}/api/models/{GGUF_REPO}/revision/{doc['sha']}?blobs=true")[2])
    assert doc["sha"] == again["sha"] and len(doc["sha"]) == 40
    shards = [s for s in doc["siblings"] if s["rfilename"].startswith(f"{QUANT}/")]
    assert shards and all(s["lfs"]["sha256"] == hub.served(GGUF_REPO)[s["rfilename"]].sha256 for s in shards)
    plain = json.loads(_call(f"{hub.url}/api/models/{GGUF_REPO}")[2])
    assert "size" not in plain["siblings"][0]
    assert _call(f"{hub.url}/api/models/{GGUF_REPO}/revision/v9")[1]["X-Error-Code"] == "RevisionNotFound"


def test_resolve_headers_redirect_and_range(hub: Hub) -> None:
    files = hub.served(GGUF_REPO)
    name = sorted(p for p in files if p.startswith(f"{QUANT}/"))[0]
    status, headers, _ = _call(f"{hub.url}/{GGUF_REPO}/resolve/main/{name}", "HEAD")
    assert status == 302
    assert headers["X-Linked-Etag"] == f'"{files[name].sha256}"'
    assert headers["X-Linked-Size"] == str(files[name].size)
    assert headers["X-Repo-Commit"] == hub.hub.repo(GGUF_REPO).sha
    location = headers["Location"]
    status, headers, body = _call(location, headers={"Range": "bytes=100-"})
    assert status == 206 and headers["Content-Range"] == f"bytes 100-{files[name].size - 1}/{files[name].size}"
    assert len(body) == files[name].size - 100
    assert _call(location.replace("sig=", "sig=0"))[0] == 403
    assert _call(location, headers={"Range": f"bytes={files[name].size}-"})[0] == 416
    status, headers, body = _call(f"{hub.url}/{BASE_REPO}/resolve/main/config.json")
    assert status == 200 and headers["ETag"] == f'"{hub.served(BASE_REPO)["config.json"].git_oid}"'
    assert _call(f"{hub.url}/{BASE_REPO}/resolve/main/nope.json")[1]["X-Error-Code"] == "EntryNotFound"


@pytest.mark.parametrize(("token", "status", "code"), [(None, 401, "GatedRepo"), ("wrong", 401, None),
                                                       (TOKEN, 200, None)])
def test_gated_repo_auth(hub: Hub, token: str | None, status: int, code: str | None) -> None:
    got, headers, _ = _call(f"{hub.url}/api/models/{BASE_REPO}/revision/main", token=token)
    assert got == status and headers["X-Error-Code"] == code
    if token == "wrong":
        assert headers["X-Error-Message"] == "Invalid credentials in Authorization header"
