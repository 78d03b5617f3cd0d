"""Post-deploy checks of the TLS reverse proxy (role tls_proxy, glm5_tls_proxy).

They skip with a reason where the proxy is off; then they check only that no proxy
unit is left behind. Through the proxy they use curl on the managed host, checking
the certificate against the server name (``--resolve`` to loopback): a self-signed
certificate is its own CA; otherwise set GLM5_TLS_PROXY_CA or rely on the system store.
"""

from __future__ import annotations

import json
import re
import uuid

import pytest
from conftest import _shq

# `systemd-analyze security` of glm5-tls-proxy.service, measured in molecule/exposure
# (systemd 257, Debian 13): docs/production.md. A hardening regression raises it.
MAX_EXPOSURE = 1.4


@pytest.fixture
def proxy(tls_proxy):
    if not tls_proxy.enabled:
        pytest.skip("glm5_tls_proxy is false on this host: no TLS proxy")
    return tls_proxy


def _curl(host, cmd, stdin=""):
    """Run curl on the host; -w puts the HTTP status on the last line."""
    full = f"printf %s {_shq(stdin)} | {cmd} -o /dev/null -w '\\n%{{http_code}}'" if stdin else (
        f"{cmd} -o /dev/null -w '\\n%{{http_code}}'")
    run = host.run(full)
    return run.rc, run.stdout.strip().splitlines()[-1] if run.stdout.strip() else "", run.stderr


def test_tls_proxy_absent_when_off(host, tls_proxy):
    if tls_proxy.enabled:
        pytest.skip("glm5_tls_proxy is true on this host")
    assert not host.file(f"/etc/systemd/system/{tls_proxy.unit}.service").exists
    assert not host.file(tls_proxy.config_dir).exists


def test_tls_proxy_runs_unprivileged(host, proxy):
    svc = host.service(f"{proxy.unit}.service")
    assert svc.is_enabled and svc.is_running
    assert host.run(f"systemctl show -p User --value {proxy.unit}.service").stdout.strip() == "glm5-proxy"
    pid = host.run(f"systemctl show -p MainPID --value {proxy.unit}.service").stdout.strip()
    assert pid not in {"", "0"}
    uids = host.run("ps -o uid= --ppid " + pid + " -p " + pid).stdout.split()
    assert uids and "0" not in uids, f"nginx processes with uid 0: {uids}"


def test_tls_proxy_distro_nginx_stays_off(host, proxy):
    if not proxy.mask_distro_nginx:
        pytest.skip("tls_proxy_mask_distro_nginx is false: the distribution's nginx.service is the site's")
    assert host.run("systemctl is-enabled nginx.service").stdout.strip() == "masked"
    assert not host.service("nginx.service").is_running
    assert host.run("ss -Htln 'sport = :80'").stdout.strip() == ""


def test_tls_proxy_key_and_certificate_files(host, proxy):
    directory = host.file(proxy.config_dir)
    assert (directory.user, directory.group, directory.mode) == ("root", "glm5-proxy", 0o750)
    key = host.file(f"{proxy.config_dir}/tls.key")
    assert (key.user, key.group, key.mode) == ("root", "glm5-proxy", 0o640)
    assert "PRIVATE KEY" in key.content_string
    cert = host.file(proxy.certificate)
    assert cert.mode == 0o644 and "BEGIN CERTIFICATE" in cert.content_string
    # The key belongs to the certificate.
    pub = host.run(f"openssl x509 -noout -pubkey -in {proxy.certificate}").stdout
    key_pub = host.run(f"openssl pkey -pubout -in {proxy.config_dir}/tls.key").stdout
    assert pub and pub == key_pub


def test_tls_proxy_config_passes_nginx_t(host, proxy):
    run = host.run(f"nginx -t -q -e stderr -g 'user glm5-proxy glm5-proxy; pid /dev/null;' "
                   f"-c {proxy.config_dir}/nginx.conf")
    assert run.rc == 0, run.stderr


def test_tls_proxy_settings(host, proxy):
    conf = host.file(f"{proxy.config_dir}/nginx.conf").content_string
    protocols = re.search(r"^\s*ssl_protocols ([^;]+);", conf, re.M)
    assert protocols and set(protocols.group(1).split()) <= {"TLSv1.2", "TLSv1.3"}
    assert re.search(r"^\s*proxy_buffering off;", conf, re.M), "streamed answers would be buffered"
    timeout = re.search(r"^\s*proxy_read_timeout (\d+)s;", conf, re.M)
    assert timeout and int(timeout.group(1)) >= 600
    upstream = re.search(r"^\s*server (\S+);", conf, re.M)
    assert upstream and re.match(r"(127\.|\[::1\]|localhost)", upstream.group(1)), upstream
    assert "$request_body" not in conf and "$http_authorization" not in conf and "$request " not in conf


def test_tls_proxy_health_over_tls(host, proxy):
    rc, status, err = _curl(host, proxy.curl("/health"))
    assert rc == 0, err
    assert status == "200"


def test_tls_proxy_models_needs_the_key(host, proxy, service):
    rc, status, err = _curl(host, proxy.curl("/v1/models"))
    assert rc == 0, err
    assert status == "401"
    if not service.api_key:
        pytest.skip("no API key: set vllm_service_api_key in the inventory or GLM5_VLLM_API_KEY")
    # The key travels on stdin (curl -H @-), so it shows in no process list.
    run = host.run(f"printf 'Authorization: Bearer %s' {_shq(service.api_key)} | "
                   f"{proxy.curl('/v1/models', '-H @-')}")
    assert run.rc == 0, run.stderr
    assert service.name in [m["id"] for m in json.loads(run.stdout)["data"]]


@pytest.mark.parametrize("version", ["--tlsv1.2 --tls-max 1.2", "--tlsv1.3"], ids=["TLS1.2", "TLS1.3"])
def test_tls_proxy_speaks_tls12_and_tls13(host, proxy, version):
    rc, status, err = _curl(host, proxy.curl("/health", version))
    assert rc == 0 and status == "200", err


def test_tls_proxy_refuses_tls11(host, proxy):
    """A client offering only TLS 1.1 is refused. The same client is first shown to complete a
    TLS 1.1 handshake with a server that allows it (openssl s_server, security level 0), so the
    refusal is the proxy's and not the client library's."""
    client = "openssl s_client -tls1_1 -cipher 'DEFAULT:@SECLEVEL=0' -connect 127.0.0.1:{port} </dev/null"
    control = host.run(
        f"timeout 20 openssl s_server -quiet -naccept 1 -accept 127.0.0.1:18479 -tls1_1 "
        f"-cipher 'DEFAULT:@SECLEVEL=0' -cert {proxy.certificate} -key {proxy.config_dir}/tls.key "
        f">/dev/null 2>&1 & sleep 1; {client.format(port=18479)}; rc=$?; wait; exit $rc"
    )
    assert control.rc == 0 and "Protocol  : TLSv1.1" in control.stdout, control.stdout[-400:]
    refused = host.run(client.format(port=proxy.port))
    assert refused.rc != 0
    assert "Cipher is (NONE)" in refused.stdout, refused.stdout[-400:]


def test_tls_proxy_body_limit(host, proxy, service):
    path = "/var/tmp/glm5-tls-proxy-body"
    # With the key, vLLM reads the whole (invalid) body before it answers.
    header = f"Authorization: Bearer {service.api_key}" if service.api_key else ""
    send = ("-H @- " if header else "") + f"--data-binary @{path}"
    try:
        assert host.run(f"head -c {proxy.max_body} /dev/zero > {path}").rc == 0
        rc, status, err = _curl(host, proxy.curl("/v1/completions", send), header)
        assert rc == 0, err
        assert status != "413", "a body of exactly the limit was refused"
        assert host.run(f"head -c 1 /dev/zero >> {path}").rc == 0
        rc, status, err = _curl(host, proxy.curl("/v1/completions", send), header)
        assert rc == 0, err
        assert status == "413"
    finally:
        host.run(f"rm -f {path}")


def test_tls_proxy_access_log_has_no_bodies_keys_or_queries(host, proxy, service):
    marker = f"prompt-{uuid.uuid4().hex}"
    query = f"q-{uuid.uuid4().hex}"
    since = host.run("date '+%Y-%m-%d %H:%M:%S'").stdout.strip()
    key = service.api_key or "no-key-configured"
    host.run(f"printf 'Authorization: Bearer %s' {_shq(key)} | "
             f"{proxy.curl('/v1/completions?' + query, '-H @- -o /dev/null --data-binary ' + _shq(marker))}")
    log = ""
    for _ in range(10):
        log = host.run(f"journalctl --no-pager -o cat -u {proxy.unit}.service --since {_shq(since)}").stdout
        if "/v1/completions" in log:
            break
        host.run("sleep 0.5")
    assert "POST /v1/completions" in log, f"no access log line: {log[-500:]}"
    assert marker not in log and query not in log and key not in log


def test_tls_proxy_firewall_admits_the_proxy_not_the_api(host, proxy, service):
    table = host.run("nft list table inet glm5_exposure")
    if table.rc != 0:
        pytest.skip("no exposure firewall on this host (exposure_firewall: false)")
    admitted = re.search(r"ip saddr @allowed_v4 tcp dport \{? ?([0-9, ]+?) ?\}? accept", table.stdout)
    dropped = re.search(r"tcp dport \{? ?([0-9, ]+?) ?\}? counter .*drop", table.stdout)
    assert admitted and dropped, table.stdout
    admitted_ports = {int(p) for p in admitted.group(1).replace(",", " ").split()}
    assert proxy.port in admitted_ports
    assert service.port not in admitted_ports, "the API port is open to the sources around the proxy"
    assert service.port in {int(p) for p in dropped.group(1).replace(",", " ").split()}


def test_tls_proxy_vllm_on_loopback_only(host, proxy, service):
    out = host.run(f"ss -Htln 'sport = :{service.port}'").stdout
    addresses = {line.split()[3].rsplit(":", 1)[0].strip("[]") for line in out.splitlines() if line.strip()}
    assert addresses and all(a.startswith("127.") or a == "::1" for a in addresses), addresses


def test_tls_proxy_exposure_score(host, proxy):
    run = host.run(f"systemd-analyze security --no-pager {proxy.unit}.service")
    assert run.rc == 0, run.stderr
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", run.stdout)
    assert m, run.stdout[-500:]
    assert float(m.group(1)) <= MAX_EXPOSURE, run.stdout[-300:]
