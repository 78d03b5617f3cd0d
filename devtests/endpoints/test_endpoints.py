"""Unit tests of role glm5's one derivation of the service's addresses (glm5_endpoints),
and that every client of the service uses it rather than its own literal."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from glm5_endpoints import FilterModule, glm5_endpoints, url_host

ROOT = Path(__file__).resolve().parents[2]


def test_default_port_no_proxy():
    ep = glm5_endpoints("127.0.0.1", 8000)
    assert ep["api_url"] == "http://127.0.0.1:8000"
    assert ep["url"] == ep["api_url"]
    assert ep["proxy"] is False and ep["proxy_url"] == ""


def test_non_default_port_is_used_everywhere():
    ep = glm5_endpoints("127.0.0.1", "8123", True, "9443", ["0.0.0.0"])
    assert ep["api_port"] == 8123 and ep["api_url"] == "http://127.0.0.1:8123"
    assert ep["proxy_url"] == "https://127.0.0.1:9443"
    # With the proxy on, clients go through the proxy's port.
    assert ep["url"] == "https://127.0.0.1:9443"


@pytest.mark.parametrize(
    ("listen", "host"),
    [("0.0.0.0", "127.0.0.1"), ("", "127.0.0.1"), ("::", "[::1]"), ("::1", "[::1]"), ("[::1]", "[::1]"),
     ("10.0.0.5", "10.0.0.5"), ("fd00::5", "[fd00::5]"), ("localhost", "localhost")],
)
def test_url_host(listen, host):
    assert url_host(listen) == host


def test_proxy_on_its_first_address():
    ep = glm5_endpoints("127.0.0.1", 8000, "true", 8443, ["::", "0.0.0.0"])
    assert ep["proxy_url"] == "https://[::1]:8443" == ep["url"]


@pytest.mark.parametrize("port", [0, 65536, "eighty", ""])
def test_bad_port_refused_with_its_value(port):
    with pytest.raises(ValueError, match=re.escape(repr(port))):
        glm5_endpoints("127.0.0.1", port)


def test_filters_registered():
    assert set(FilterModule().filters()) == {"glm5_endpoints", "glm5_url_host"}


# Every client of the service: none may spell a port or a URL of its own.
CLIENTS = [
    "playbooks/phases/verify.yml",
    "playbooks/diagnose.yml",
    "roles/rollback/defaults/main.yml",
    "roles/vllm_service/vars/main.yml",
    "roles/tls_proxy/defaults/main.yml",
    "roles/tls_proxy/vars/main.yml",
]


@pytest.mark.parametrize("path", CLIENTS)
def test_clients_use_the_one_derivation(path):
    text = (ROOT / path).read_text()
    assert "glm5_api_endpoints" in text, f"{path} does not use glm5_api_endpoints"
    assert not re.search(r"\b(8000|8443)\b", text), f"{path} spells a port literal"
    assert not re.search(r"https?://(127\.0\.0\.1|\{\{)", text), f"{path} builds a URL of its own"


# A fleet's router: its own addresses and its backends' URLs through the same filter
# (glm5_endpoints), the backends' ports with glm5_api_endpoints' precedence.
ROUTER = [
    "roles/vllm_router/vars/main.yml",
    "roles/vllm_router/defaults/main.yml",
]


@pytest.mark.parametrize("path", ROUTER)
def test_router_uses_the_one_derivation(path):
    text = (ROOT / path).read_text()
    assert not re.search(r"\b(8000|8443)\b", text), f"{path} spells an API port literal"
    assert not re.search(r"https?://", text), f"{path} builds a URL of its own"


def test_router_urls_from_glm5_endpoints():
    text = (ROOT / "roles/vllm_router/vars/main.yml").read_text()
    assert "vllm_router_host | glm5_endpoints(vllm_router_port)" in text
    assert "(backend.address | glm5_endpoints(backend.port)).api_url" in text
