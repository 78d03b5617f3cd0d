"""The offline bundle's manifest (glm5_offline_bundle: built / verified) and the
parsing of apt's answers by glm5_bundle_debs."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import glm5_bundle_debs as debs
import glm5_offline_bundle as ob
import pytest

VERSIONS = {"vllm": "0.20.2", "lock_sha256": "ab" * 32}


def _params(path: Path, **over: Any) -> dict[str, Any]:
    params: dict[str, Any] = {
        "path": str(path),
        "state": "verified",
        "versions": {},
        "manifest_sha256": "",
        "hash_prefixes": [""],
        "size_prefixes": [],
        "require": [],
    }
    params.update(over)
    return params


@pytest.fixture
def bundle(tmp_path: Path) -> tuple[Path, str]:
    (tmp_path / "wheels").mkdir()
    (tmp_path / "debs").mkdir()
    (tmp_path / "model/gguf").mkdir(parents=True)
    (tmp_path / "wheels/six-1.17.0-py2.py3-none-any.whl").write_bytes(b"wheel")
    (tmp_path / "debs/Packages").write_text("Package: x\n")
    (tmp_path / "debs/x_1_amd64.deb").write_bytes(b"deb")
    (tmp_path / "model/gguf/a.gguf").write_bytes(b"GGUF" * 10)
    result = ob.run(_params(tmp_path, state="built", versions=VERSIONS), check_mode=False)
    return tmp_path, result["manifest_sha256"]


def test_build_writes_manifest_and_returns_its_sha(bundle: tuple[Path, str]) -> None:
    root, sha = bundle
    raw = (root / ob.MANIFEST).read_bytes()
    assert hashlib.sha256(raw).hexdigest() == sha
    doc = json.loads(raw)
    assert doc["versions"] == VERSIONS
    assert doc["files"]["debs/x_1_amd64.deb"] == {"size": 3, "sha256": hashlib.sha256(b"deb").hexdigest()}
    assert ob.MANIFEST not in doc["files"]


def test_rebuild_of_same_content_changes_nothing(bundle: tuple[Path, str]) -> None:
    root, sha = bundle
    again = ob.run(_params(root, state="built", versions=VERSIONS), check_mode=False)
    assert again["changed"] is False and again["manifest_sha256"] == sha


def test_build_in_check_mode_writes_nothing(bundle: tuple[Path, str]) -> None:
    root, sha = bundle
    (root / "wheels/new-1-py3-none-any.whl").write_bytes(b"new")
    res = ob.run(_params(root, state="built", versions=VERSIONS), check_mode=True)
    assert res["changed"] is True
    assert hashlib.sha256((root / ob.MANIFEST).read_bytes()).hexdigest() == sha


def test_build_refuses_links(bundle: tuple[Path, str]) -> None:
    root, _ = bundle
    (root / "wheels/link.whl").symlink_to(root / "debs/Packages")
    with pytest.raises(ValueError, match="not a regular file"):
        ob.run(_params(root, state="built"), check_mode=False)


def test_verify_accepts_the_trusted_bundle(bundle: tuple[Path, str]) -> None:
    root, sha = bundle
    res = ob.run(_params(root, manifest_sha256=sha.upper(), require=["debs/Packages"]), check_mode=True)
    assert res["changed"] is False and res["versions"] == VERSIONS and res["checked"] == 4


def test_verify_refuses_another_manifest(bundle: tuple[Path, str]) -> None:
    root, _ = bundle
    with pytest.raises(ValueError, match="not the one the inventory trusts"):
        ob.run(_params(root, manifest_sha256="0" * 64), check_mode=True)


def test_verify_refuses_a_missing_directory_or_manifest(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist on this host"):
        ob.run(_params(tmp_path / "absent", manifest_sha256="0" * 64), check_mode=True)
    with pytest.raises(ValueError, match="not an offline bundle"):
        ob.run(_params(tmp_path, manifest_sha256="0" * 64), check_mode=True)


def test_verify_names_a_tampered_file_of_the_same_size(bundle: tuple[Path, str]) -> None:
    root, sha = bundle
    (root / "debs/x_1_amd64.deb").write_bytes(b"DEB")
    with pytest.raises(ValueError, match=r"debs/x_1_amd64.deb: sha256 differs"):
        ob.run(_params(root, manifest_sha256=sha), check_mode=True)
    # Only the prefixes a role consumes are hashed.
    ob.run(_params(root, manifest_sha256=sha, hash_prefixes=["wheels/"]), check_mode=True)


def test_verify_sizes_only_and_missing_files(bundle: tuple[Path, str]) -> None:
    root, sha = bundle
    (root / "model/gguf/a.gguf").write_bytes(b"GGUF" * 9)
    (root / "wheels/six-1.17.0-py2.py3-none-any.whl").unlink()
    with pytest.raises(ValueError) as err:
        ob.run(_params(root, manifest_sha256=sha, hash_prefixes=["wheels/"], size_prefixes=["model/"]), check_mode=True)
    assert "model/gguf/a.gguf: size 36, manifest says 40" in str(err.value)
    assert "wheels/six-1.17.0-py2.py3-none-any.whl: missing" in str(err.value)


def test_verify_requires_what_a_role_consumes(bundle: tuple[Path, str]) -> None:
    root, sha = bundle
    with pytest.raises(ValueError, match=r"wheels/uv-0.13.9-: not in the bundle"):
        ob.run(_params(root, manifest_sha256=sha, require=["wheels/uv-0.13.9-"]), check_mode=True)


def test_verify_refuses_paths_leaving_the_bundle(tmp_path: Path) -> None:
    text = ob.render({"../etc/passwd": {"size": 1, "sha256": "0" * 64}}, {})
    (tmp_path / ob.MANIFEST).write_text(text)
    sha = hashlib.sha256(text.encode()).hexdigest()
    with pytest.raises(ValueError, match="leaves the bundle"):
        ob.run(_params(tmp_path, manifest_sha256=sha), check_mode=True)


def test_parse_print_uris() -> None:
    text = (
        "'http://deb.example/pool/main/g/glibc/libc6_2.41-12%2bdeb13u5_amd64.deb' "
        "libc6_2.41-12+deb13u5_amd64.deb 2850108 MD5Sum:3cf652965605c5dc915ff47a929bbe84\n"
        "'file:/x/bsdutils_1%3a2.41-1_amd64.deb' bsdutils_1%3a2.41-1_amd64.deb 10 SHA256:ABCD\n"
        "not a uri line\n"
    )
    got = debs.parse_print_uris(text)
    assert got["libc6_2.41-12+deb13u5_amd64.deb"]["algo"] == "md5"
    assert got["bsdutils_1%3a2.41-1_amd64.deb"] == {
        "uri": "file:/x/bsdutils_1%3a2.41-1_amd64.deb",
        "size": 10,
        "algo": "sha256",
        "digest": "abcd",
    }
    assert len(got) == 2


def test_spec_from_file_name() -> None:
    assert debs._spec("bsdutils_1%3a2.41-1_amd64.deb") == "bsdutils:amd64=1:2.41-1"
    assert debs._spec("adduser_3.152_all.deb") == "adduser=3.152"


def test_is_current(tmp_path: Path) -> None:
    deb = tmp_path / "a.deb"
    deb.write_bytes(b"abc")
    want = {"size": 3, "algo": "sha256", "digest": hashlib.sha256(b"abc").hexdigest()}
    assert debs.is_current(deb, want)
    assert not debs.is_current(deb, {**want, "digest": "0" * 64})
    assert not debs.is_current(deb, {**want, "size": 4})
    assert not debs.is_current(deb, {**want, "algo": "crc32"})
    assert not debs.is_current(tmp_path / "absent.deb", want)
