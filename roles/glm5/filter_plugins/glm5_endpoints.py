"""The one derivation of where the API and the TLS proxy are reached from the host.

Used by every client of the service: role vllm_service's readiness wait, role
tls_proxy's upstream and readiness check, role rollback's health wait,
playbooks/verify.yml, playbooks/diagnose.yml (through the glm5_api_endpoints
variable of role glm5), and the testinfra suite (tests/conftest.py imports this
module), so a non-default port or listen address cannot be probed differently by
one of them.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Sequence
from typing import Any

# A wildcard listen address is reached on the loopback of its family.
_WILDCARD = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}


def url_host(listen: Any) -> str:
    """The host part of a URL that reaches a socket listening on ``listen`` from the
    same machine: the loopback for a wildcard, IPv6 literals in brackets."""
    text = str(listen if listen is not None else "").strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    text = _WILDCARD.get(text, text)
    try:
        is_v6 = ipaddress.ip_address(text).version == 6
    except ValueError:
        is_v6 = False
    return f"[{text}]" if is_v6 else text


def _port(value: Any, name: str) -> int:
    try:
        port = int(str(value).strip())
    except ValueError:
        raise ValueError(f"glm5_endpoints: {name} must be a port number 1-65535 (got {value!r})") from None
    if not 0 < port < 65536:
        raise ValueError(f"glm5_endpoints: {name} must be a port number 1-65535 (got {value!r})")
    return port


def _truthy(value: Any) -> bool:
    return value if isinstance(value, bool) else str(value).strip().lower() in {"1", "true", "yes", "on"}


def glm5_endpoints(
    api_host: Any,
    api_port: Any,
    tls_proxy: Any = False,
    tls_proxy_port: Any = 8443,
    tls_proxy_addresses: Sequence[Any] | None = None,
) -> dict[str, Any]:
    """Where a client on the host reaches the service.

    ``api_host``/``api_port``: where vLLM listens (vllm_service_host, vllm_service_port,
    which defaults to glm5_api_port); ``tls_proxy``/``tls_proxy_port``/
    ``tls_proxy_addresses``: glm5_tls_proxy, glm5_tls_proxy_port and the proxy's listen
    addresses (the first one is probed).

    Returns ``api_host``/``api_port``/``api_url`` (vLLM itself, plain HTTP),
    ``proxy``, ``proxy_host``/``proxy_port``/``proxy_url`` (the TLS proxy; the URL is
    "" when the proxy is off) and ``url``: what a client uses, the proxy's URL when the
    proxy is on, else the API's.
    """
    port = _port(api_port, "the API port")
    host = url_host(api_host)
    proxy = _truthy(tls_proxy)
    addresses = list(tls_proxy_addresses or ["0.0.0.0"]) or ["0.0.0.0"]
    proxy_port = _port(tls_proxy_port, "the TLS proxy port")
    proxy_host = url_host(addresses[0])
    api_url = f"http://{host}:{port}"
    proxy_url = f"https://{proxy_host}:{proxy_port}" if proxy else ""
    return {
        "api_host": host,
        "api_port": port,
        "api_url": api_url,
        "proxy": proxy,
        "proxy_host": proxy_host,
        "proxy_port": proxy_port,
        "proxy_url": proxy_url,
        "url": proxy_url or api_url,
    }


class FilterModule:
    """glm5 filters."""

    def filters(self) -> dict[str, Callable[..., Any]]:
        return {"glm5_endpoints": glm5_endpoints, "glm5_url_host": url_host}
