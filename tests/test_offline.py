"""Post-deploy checks of an offline site (glm5_offline_bundle_dir set): apt installs
only from the bundle's file: repository, the ml-env's packages are the bundle's, the
bundle still matches the manifest the inventory trusts. They skip on online hosts.

Environment: GLM5_OFFLINE_BUNDLE_DIR (else the inventory's glm5_offline_bundle_dir);
GLM5_OFFLINE_EXPECT_NO_NETWORK=1 (molecule scenario offline) also requires that the
host cannot reach any package index at all: the indexes tried are GLM5_OFFLINE_PROBE_URLS
(space-separated), else the host's own: every non-file URI in its apt source files (disabled
ones included) and pip's default index, as the pip of the uv tool venv names it.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import pytest
from conftest import ansible_var

ML_ENV = os.environ.get("GLM5_ML_ENV_PATH", "/opt/ml-env")
UV_VENV = os.environ.get("GLM5_UV_VENV", "/opt/glm5-uv")


@pytest.fixture(scope="module")
def bundle(host: Any) -> str:
    path = os.environ.get("GLM5_OFFLINE_BUNDLE_DIR") or ansible_var(host, "glm5_offline_bundle_dir", "")
    if not path:
        pytest.skip("not an offline site (glm5_offline_bundle_dir is empty)")
    return str(path).rstrip("/")


def test_offline_apt_sources_are_the_bundle_only(host: Any, bundle: str) -> None:
    source = host.file("/etc/apt/sources.list.d/glm5-offline.sources")
    assert source.exists and f"URIs: file:{bundle}/debs/" in source.content_string
    policy = host.check_output("apt-cache policy")
    origins = [
        line.split()[1]
        for line in policy.splitlines()
        if line.strip()[:3].isdigit() and "/var/lib/dpkg/status" not in line
    ]
    assert origins, policy
    assert all(o.startswith(f"file:{bundle}/debs") for o in origins), f"apt reads other sources: {sorted(set(origins))}"


def test_offline_driver_came_from_the_bundle(host: Any, bundle: str) -> None:
    branch = ansible_var(host, "glm5_nvidia_driver_branch", "580")
    name = f"nvidia-open-{branch}"
    assert host.package(name).is_installed
    policy = host.check_output(f"apt-cache policy {name}")
    # The installed version's entry ("*** <version>") lists where it is available from.
    after = policy.split("***", 1)[1].splitlines()[1:]
    sources = [line.split()[1] for line in after if line.startswith("        ")]
    assert any(s.startswith(f"file:{bundle}/debs") for s in sources), policy


def test_offline_ml_env_from_the_bundle_wheels(host: Any, bundle: str) -> None:
    manifest = json.loads(host.file(f"{bundle}/bundle-manifest.json").content_string)
    lock = host.file(f"{ML_ENV}/glm5-lock.txt").content_string
    assert hashlib.sha256(lock.encode()).hexdigest() == manifest["versions"]["lock_sha256"]
    freeze = host.check_output(f"/opt/glm5-uv/bin/uv pip freeze --offline --python {ML_ENV}/bin/python")
    wheels = [p for p in manifest["files"] if p.startswith("wheels/")]
    for line in freeze.splitlines():
        if " @ " in line:  # installed from a file (flash-attn's wheel): it must be the bundle's
            assert line.split(" @ ", 1)[1].startswith(f"file://{bundle}/wheels/"), line
            continue
        name, _, version = line.partition("==")
        stem = f"{name.replace('-', '_').lower()}-{version}-"
        assert any(w[len("wheels/") :].lower().startswith(stem) for w in wheels), f"{line}: not a bundle wheel"


def test_offline_bundle_matches_its_manifest(host: Any, bundle: str) -> None:
    """The packages and wheels in the bundle are still those its manifest names; and the
    manifest is the one the inventory trusts, where the inventory is readable."""
    manifest = json.loads(host.file(f"{bundle}/bundle-manifest.json").content_string)
    files = sorted(p for p in manifest["files"] if p.startswith(("debs/", "wheels/")))
    assert files
    sums = host.check_output(f"cd {bundle} && sha256sum " + " ".join(files))
    got = {name: digest for digest, name in (line.split(maxsplit=1) for line in sums.splitlines())}
    wrong = [p for p in files if got.get(p) != manifest["files"][p]["sha256"]]
    assert not wrong, f"differ from the manifest: {wrong}"
    expected = ansible_var(host, "glm5_offline_bundle_sha256", "")
    if expected:
        assert host.check_output(f"sha256sum {bundle}/bundle-manifest.json").split()[0] == expected


def _probe_urls(host: Any) -> list[str]:
    if os.environ.get("GLM5_OFFLINE_PROBE_URLS"):
        return os.environ["GLM5_OFFLINE_PROBE_URLS"].split()
    apt = host.run(
        "cat /etc/apt/sources.list* /etc/apt/sources.list.d/* /etc/apt/*.disabled 2>/dev/null"
        " | grep -oE '(https?|ftp)://[^ ]+' | sort -u"
    ).stdout.split()
    pip = host.run(f"{UV_VENV}/bin/python -c 'from pip._internal.models.index import PyPI; print(PyPI.simple_url)'")
    return apt + ([pip.stdout.strip()] if pip.rc == 0 and pip.stdout.strip() else [])


def test_offline_host_has_no_route_to_package_indexes(host: Any, bundle: str) -> None:
    if os.environ.get("GLM5_OFFLINE_EXPECT_NO_NETWORK") != "1":
        pytest.skip("only where the host is meant to be cut off (GLM5_OFFLINE_EXPECT_NO_NETWORK=1)")
    urls = _probe_urls(host)
    assert urls, "no package index URL found to probe"
    for url in urls:
        probe = host.run(f"python3 -c \"import urllib.request; urllib.request.urlopen('{url}', timeout=5)\"")
        assert probe.rc != 0, f"{url} is reachable from the offline site"
    assert "default" not in host.check_output("ip route show")
    assert host.check_output("ls /sys/class/net").split() == ["lo"]
