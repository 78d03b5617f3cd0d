"""Unit tests of the rules that check what a setting means (roles/glm5/filter_plugins/
glm5_validate.py): the argument specs' types, URLs, the host checks (paths as the host
resolves them, CA bundles, ports), settings no role declares; role vllm_service's flag
policy (filter_plugins/vllm_service_policy.py); and module glm5_host_probe's readers."""

from __future__ import annotations

import socket
import ssl
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from load_file import load_file

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def v() -> ModuleType:
    return load_file(ROOT / "roles/glm5/filter_plugins/glm5_validate.py")


@pytest.fixture(scope="module")
def policy() -> ModuleType:
    return load_file(ROOT / "roles/vllm_service/filter_plugins/vllm_service_policy.py")


@pytest.fixture(scope="module")
def probe() -> ModuleType:
    return load_file(ROOT / "roles/glm5/library/glm5_host_probe.py")


# --- argument specs -------------------------------------------------------------


def _spec(v: ModuleType, options: dict[str, Any], aliases: dict[str, str] | None = None) -> dict[str, Any]:
    aliases = aliases or {}
    return {"options": options, "aliases": aliases,
            "names": list(options) + sorted(set(aliases.values()) - set(options)), "unset": v.UNSET}


@pytest.mark.parametrize(("value", "form"), [
    (8.5, "a whole number"), (8.0, "a whole number (8)"), ("8 ", "a whole number without spaces (8)"),
    (" 8", "a whole number without spaces (8)"), ("eight", "a whole number"), (True, "a whole number (not a boolean)"),
    ("08", "a whole number"), ("1e3", "a whole number"), ([8], "a whole number"),
])
def test_int_refused_in_one_line(v, value, form):
    spec = _spec(v, {"glm5_tensor_parallel_size": {"type": "int"}})
    lines = v.glm5_spec_refusals(spec, [value])
    assert lines == [f"glm5_tensor_parallel_size = {value!r} is refused; expected {form}."]


@pytest.mark.parametrize("value", [8, "8", -1, "0", 0])
def test_int_accepted(v, value):
    assert v.glm5_spec_refusals(_spec(v, {"n": {"type": "int"}}), [value]) == []


@pytest.mark.parametrize(("kind", "good", "bad"), [
    ("float", [0.92, 1, "0.5", ".5", "1e-3"], ["0.92 ", "abc", True]),
    ("bool", [True, False, "yes", "no", "true", "False", 1, 0, "on"], ["maybe", 2, "", None.__class__.__name__]),
    ("str", ["x", "", 8, 0.5], [True, ["x"], {"a": 1}]),
    ("list", [[], ["a"], [1, "b"]], ["--trust-remote-code", "a,b", {"a": 1}]),
    ("dict", [{}, {"A": "1"}], ["A=1", ["A"]]),
])
def test_types(v, kind, good, bad):
    spec = _spec(v, {"x": {"type": kind}})
    for value in good:
        assert v.glm5_spec_refusals(spec, [value]) == [], value
    for value in bad:
        lines = v.glm5_spec_refusals(spec, [value])
        assert len(lines) == 1 and lines[0].startswith(f"x = {value!r} is refused; expected "), (value, lines)


def test_list_elements_and_choices(v):
    spec = _spec(v, {"ports": {"type": "list", "elements": "int"},
                     "mode": {"type": "str", "choices": ["auto", "never"]},
                     "n": {"type": "int", "choices": [0, 1, 2, 3]}})
    lines = v.glm5_spec_refusals(spec, [[9400, "x", 8.5], "sometimes", "4"])
    assert lines == [
        "ports = [9400, 'x', 8.5] is refused; expected a list of a whole number items ('x', 8.5 is not).",
        "mode = 'sometimes' is refused; expected one of auto, never.",
        "n = '4' is refused; expected one of 0, 1, 2, 3.",
    ]


def test_alias_named_only_when_the_value_comes_from_it(v):
    spec = _spec(v, {"vllm_service_port": {"type": "int"}}, {"vllm_service_port": "glm5_api_port"})
    assert v.glm5_spec_refusals(spec, ["x", "x"]) == [
        "vllm_service_port (glm5_api_port) = 'x' is refused; expected a whole number."]
    assert v.glm5_spec_refusals(spec, ["x", 8000]) == ["vllm_service_port = 'x' is refused; expected a whole number."]


def test_unset_null_and_secret(v):
    spec = _spec(v, {"a": {"type": "str", "default": ""}, "b": {"type": "str"}, "key": {"type": "int", "no_log": True}})
    assert v.glm5_spec_refusals(spec, [v.UNSET, None, "sekrit"]) == [
        "key: the value is refused; expected a whole number."]
    assert v.glm5_spec_refusals(spec, [None, v.UNSET, v.UNSET]) == [
        "a is null (an empty YAML value); expected a string (\"\" or [] where empty means none)."]


def test_spec_inputs_read_the_role(v):
    inputs = v.glm5_spec_inputs(str(ROOT / "roles/vllm_service"))
    assert inputs["aliases"]["vllm_service_port"] == "glm5_api_port"
    assert inputs["aliases"]["vllm_service_tensor_parallel_size"] == "glm5_tensor_parallel_size"
    assert "vllm_service_unit_name" not in inputs["aliases"]  # "vllm-{{ ... }}" is not the value itself
    assert inputs["names"][: len(inputs["options"])] == list(inputs["options"])
    assert "glm5_api_port" in inputs["names"]
    glm5 = v.glm5_spec_inputs(str(ROOT / "roles/glm5"), "settings")
    assert "glm5_tensor_parallel_size" in glm5["options"] and glm5["aliases"] == {}


def test_every_role_default_fits_its_spec(v):
    """The strict rules accept every role's own literal defaults (a spec that disagrees
    with its defaults would refuse a run that sets nothing)."""
    import yaml

    for role in sorted(p for p in (ROOT / "roles").iterdir() if (p / "meta/argument_specs.yml").is_file()):
        entry = "settings" if role.name == "glm5" else "main"
        inputs = v.glm5_spec_inputs(str(role), entry)
        main = role / "defaults/main.yml"
        files = [main] if main.is_file() else sorted((role / "defaults/main").glob("*.yml"))
        defaults: dict[str, Any] = {}
        for name in files:
            defaults.update(yaml.safe_load(name.read_text()) or {})
        values = [v.UNSET if isinstance(x, str) and "{{" in x else x
                  for x in (defaults.get(n, v.UNSET) for n in inputs["names"])]
        assert v.glm5_spec_refusals(inputs, values) == [], role.name


# --- URLs -------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "kind"), [
    ("http://proxy.example:3128", "proxy"), ("https://proxy.example", "proxy"), ("socks5h://10.0.0.1:1080", "proxy"),
    ("http://user:pw@proxy:3128/", "proxy"), ("https://mirror.example/simple", "index"),
    ("http://[2001:db8::1]:8080/pypi/simple", "index"), ("file:///srv/wheels", "index"), ("", "proxy"),
])
def test_url_accepted(v, value, kind):
    assert v.glm5_url_problem(value, "glm5_https_proxy", kind) == ""


@pytest.mark.parametrize(("value", "kind", "why"), [
    ("not a url", "proxy", "a space or a control character"),
    ("proxy.example:3128", "proxy", "no scheme://"),
    ("ftp://mirror.example", "index", "scheme ftp"),
    ("http://", "proxy", "no host"),
    ("http://proxy:99999", "proxy", "port is not 1-65535"),
    ("http://proxy:0", "proxy", "port is not 1-65535"),
    ("http://proxy:abc", "proxy", "port is not 1-65535"),
    ("http://proxy:3128/path", "proxy", "no path"),
    ("file://host/x", "index", "file:///path"),
])
def test_url_refused(v, value, kind, why):
    line = v.glm5_url_problem(value, "glm5_https_proxy", kind)
    assert line.startswith(f"glm5_https_proxy = {value!r} is refused: ") and why in line, line
    assert "expected" in line and "\n" not in line


def test_url_accepted_form_names_what_the_url_is_for(v):
    """A repository's key URL is not a package index: the accepted form says so."""
    key = v.glm5_url_problem("mirror.example/key.pub", "nvidia_driver_repo_key_url", "url")
    assert "no scheme://" in key and key.endswith("expected a URL http(s)://host[:port]/path or file:///path.")
    index = v.glm5_url_problem("mirror.example/simple", "glm5_pip_index_url", "index")
    assert index.endswith("expected an index URL http(s)://host[:port]/path or file:///path.")
    assert v.glm5_url_problem("https://mirror.example/key.pub", "nvidia_driver_repo_key_url", "url") == ""


def test_url_password_never_printed(v):
    line = v.glm5_url_problem("http://alice:s3cret@proxy:99999", "glm5_http_proxy", "proxy")
    assert "s3cret" not in line and "alice" not in line and "'http://***@proxy:99999'" in line


# --- host checks ------------------------------------------------------------------


def _probe(**kw: Any) -> dict[str, Any]:
    base = {"paths": {}, "pem": {}, "listeners": {}, "ssh_ports": {"22": "its standard port"},
            "unprivileged_port_start": 1024, "glob_units": []}
    return {**base, **kw}


def _path(v, name, value, writes=True):
    item = {"kind": "path", "name": name, "var": name.split(" ")[0], "value": value, "writes": writes}
    return v.glm5_host_items([item])


def test_path_through_a_link_into_a_system_directory(v):
    items = _path(v, "model_dir (glm5_model_dir)", "/srv/models/evil")
    probe = _probe(paths={"/srv/models/evil": {"realpath": "/etc", "exists": True}})
    assert v.glm5_host_refusals(items, probe) == [
        "model_dir (glm5_model_dir) = '/srv/models/evil' resolves on this host to '/etc' (through a symbolic link),"
        " a system directory; expected " + v.ACCEPTED_RESOLVED + "."]


@pytest.mark.parametrize(("value", "real", "why"), [
    ("/srv/models/evil/glm5", "/etc/glm5", "inside the system directory /etc"),
    ("/opt/glm5-usr/ml-envs", "/usr/ml-envs", "inside the system directory /usr"),
    ("/srv/models/kernel/x", "/proc/x", "inside the system directory /proc"),
    ("/srv/m", "/lib/x", "inside the system directory /lib"),
    ("/srv/m", "/var/lib/dpkg/info", "inside the system directory /var/lib/dpkg"),
])
def test_written_path_led_into_an_os_tree(v, value, real, why):
    probe = _probe(paths={value: {"realpath": real, "exists": True}})
    lines = v.glm5_host_refusals(_path(v, "model_dir", value), probe)
    assert len(lines) == 1 and why in lines[0] and repr(real) in lines[0], lines


@pytest.mark.parametrize(("value", "real"), [
    ("/opt/ml-env", "/opt/ml-envs/ml-env-0123456789ab"),  # the project's own link
    ("/srv/models/glm-5", "/data/models/glm-5"),  # a model disk mounted elsewhere
    ("/usr/local/cuda", "/usr/local/cuda-13.0"),
    ("/etc/glm5/nccl-check.json", "/etc/glm5-real/nccl-check.json"),  # spelt in /etc, resolved in /etc
    ("/srv/models/glm-5", "/srv/models/glm-5"),
])
def test_links_that_stay_where_they_are_spelt_are_fine(v, value, real):
    probe = _probe(paths={value: {"realpath": real, "exists": True}})
    assert v.glm5_host_refusals(_path(v, "x", value), probe) == []


def test_read_only_path_may_lead_into_etc_but_not_be_a_system_directory(v):
    items = _path(v, "glm5_ca_bundle", "/opt/corp/ca.pem", writes=False)
    probe = _probe(paths={"/opt/corp/ca.pem": {"realpath": "/etc/ssl/certs/ca.pem", "exists": True}})
    assert v.glm5_host_refusals(items, probe) == []
    items = _path(v, "model_local_dir", "/srv/src", writes=False)
    probe = _probe(paths={"/srv/src": {"realpath": "/etc", "exists": True}})
    assert "a system directory" in v.glm5_host_refusals(items, probe)[0]


def test_trailing_slash_normalized_and_checked_once(v):
    items = v.glm5_host_items([
        {"kind": "path", "name": "model_dir (glm5_model_dir)", "var": "model_dir", "value": "/srv/models/glm-5/"},
        {"kind": "path", "name": "ml_env_path (glm5_venv_path)", "var": "ml_env_path", "value": "/opt/ml-env/",
         "shared": "glm5_venv_path", "shared_value": "/opt/ml-env/"},
        {"kind": "path", "name": "x", "var": "x", "value": "/srv/../etc"},  # refused by its own rule: not an item
        {"kind": "pem", "name": "glm5_ca_bundle", "value": "/opt/ca.pem/"},  # a file: not normalized
    ])
    assert [i["value"] for i in items] == ["/srv/models/glm-5", "/opt/ml-env", "/opt/ca.pem/"]
    assert v.glm5_host_normalized(items) == [
        {"var": "model_dir", "value": "/srv/models/glm-5", "name": "model_dir (glm5_model_dir)",
         "raw": "/srv/models/glm-5/"},
        {"var": "ml_env_path", "value": "/opt/ml-env", "name": "ml_env_path (glm5_venv_path)", "raw": "/opt/ml-env/"},
        {"var": "glm5_venv_path", "value": "/opt/ml-env", "name": "ml_env_path (glm5_venv_path)",
         "raw": "/opt/ml-env/"},
    ]
    entries = v.glm5_host_normalized(items)
    # After the set_fact: glm5_venv_path still holds the spelling (given with -e).
    lines = v.glm5_host_unnormalized(entries, ["/srv/models/glm-5", "/opt/ml-env", "/opt/ml-env/"])
    assert len(lines) == 1 and lines[0].startswith("glm5_venv_path = '/opt/ml-env/' is given on the command line (-e)")
    assert "expected '/opt/ml-env'" in lines[0]


@pytest.mark.parametrize(("answer", "why"), [
    ({"exists": False, "is_file": False}, "does not exist on this host"),
    ({"exists": True, "is_file": False}, "is not a file"),
    ({"exists": True, "is_file": True, "certificates": 0, "error": "[X509: NO_CERTIFICATE_OR_CRL_FOUND]"},
     "does not load as a CA bundle ([X509: NO_CERTIFICATE_OR_CRL_FOUND])"),
    ({"exists": True, "is_file": True, "certificates": 0, "error": ""},
     "does not load as a CA bundle (no certificate in it)"),
])
def test_ca_bundle(v, answer, why):
    items = v.glm5_host_items([{"kind": "pem", "name": "glm5_ca_bundle", "value": "/x/ca.pem"},
                               {"kind": "pem", "name": "ml_env_ca_bundle (glm5_ca_bundle)", "value": "/x/ca.pem"}])
    lines = v.glm5_host_refusals(items, _probe(pem={"/x/ca.pem": answer}))
    assert len(lines) == 1 and lines[0].startswith("glm5_ca_bundle = '/x/ca.pem' " + why), lines
    good = {"exists": True, "is_file": True, "certificates": 3, "error": ""}
    assert v.glm5_host_refusals(items, _probe(pem={"/x/ca.pem": good})) == []


def _port(v, service, value, **kw):
    names = {"api": "vllm_service_port (glm5_api_port)", "tls_proxy": "tls_proxy_port (glm5_tls_proxy_port)",
             "gpu_exporter": "gpu_exporter_port (glm5_gpu_exporter_port)", "router": "vllm_router_port",
             "router_prometheus": "vllm_router_prometheus_port"}
    labels = {"api": "vLLM's API", "tls_proxy": "the TLS proxy", "gpu_exporter": "the GPU exporter",
              "router": "the router", "router_prometheus": "the router's metrics"}
    return {"kind": "port", "name": names[service], "value": value, "service": service, "label": labels[service],
            "privileged": service == "tls_proxy", **kw}


def test_ssh_port_refused_even_when_nothing_listens(v):
    items = v.glm5_host_items([_port(v, "api", 22), _port(v, "gpu_exporter", 2200)])
    probe = _probe(ssh_ports={"22": "its standard port", "2200": "/etc/ssh/sshd_config: Port 2200"})
    assert v.glm5_host_refusals(items, probe) == [
        "vllm_service_port (glm5_api_port) = 22 is SSH's port (its standard port); expected another port"
        " (SSH must stay reachable).",
        "gpu_exporter_port (glm5_gpu_exporter_port) = 2200 is SSH's port (/etc/ssh/sshd_config: Port 2200);"
        " expected another port (SSH must stay reachable)."]
    # The port this run connects on (from the controller).
    lines = v.glm5_host_refusals(v.glm5_host_items([_port(v, "api", 2022)]), _probe(),
                                 ssh_extra={"2022": "ansible_port"})
    assert lines and "is SSH's port (ansible_port)" in lines[0]


def test_privileged_range(v):
    items = v.glm5_host_items([_port(v, "api", 80), _port(v, "tls_proxy", 443)])
    lines = v.glm5_host_refusals(items, _probe())
    assert lines == ["vllm_service_port (glm5_api_port) = 80 is a privileged port (below 1024 on this host) and vLLM's"
                     " API runs without privileges (no CAP_NET_BIND_SERVICE); expected 1024-65535."]
    # A host whose kernel opens the range (ip_unprivileged_port_start = 0) lets it bind.
    assert v.glm5_host_refusals(items, _probe(unprivileged_port_start=0)) == []


def test_clash_one_line_naming_both(v):
    items = v.glm5_host_items([_port(v, "gpu_exporter", 8000), _port(v, "api", 8000)])
    assert v.glm5_host_refusals(items, _probe()) == [
        "gpu_exporter_port (glm5_gpu_exporter_port) = 8000 is also the port of vLLM's API"
        " (glm5_api_port); expected a port of its own."]
    # Against a port this run does not check itself (seeds).
    seeds = [{"kind": "port", "service": "api", "value": 9835, "name": "glm5_api_port", "label": "vLLM's API"}]
    lines = v.glm5_host_refusals(v.glm5_host_items([_port(v, "gpu_exporter", 9835)]), _probe(), seeds)
    assert lines == ["gpu_exporter_port (glm5_gpu_exporter_port) = 9835 is also the port of vLLM's API (glm5_api_port);"
                     " expected a port of its own."]
    # A refused seed (port 0) is no partner; a checked service's seed is replaced by the check.
    seeds0 = [{"kind": "port", "service": "api", "value": 0, "name": "glm5_api_port"}]
    assert v.glm5_host_refusals(v.glm5_host_items([_port(v, "tls_proxy", 8443)]), _probe(), seeds0) == []
    seeds_api = [{"kind": "port", "service": "api", "value": 8443, "name": "glm5_api_port"}]
    assert v.glm5_host_refusals(v.glm5_host_items([_port(v, "api", 8000)]), _probe(), seeds_api) == []
    # The router's two ports.
    lines = v.glm5_host_refusals(v.glm5_host_items([_port(v, "router_prometheus", 8100), _port(v, "router", 8100)]),
                                 _probe())
    assert lines == ["vllm_router_prometheus_port = 8100 is also the port of the router (vllm_router_port);"
                     " expected a port of its own."]


def test_only_the_first_cause_of_a_port(v):
    """22 is SSH's and below 1024 and another service's: one line, SSH's."""
    items = v.glm5_host_items([_port(v, "api", 22), _port(v, "gpu_exporter", 22)])
    lines = v.glm5_host_refusals(items, _probe())
    assert len(lines) == 2 and all("SSH's port" in line for line in lines)


def test_held_port_names_process_and_unit(v):
    item = _port(v, "api", 2222, unit="vllm-glm-5.service")
    listeners = {"2222": [{"pid": 41, "command": "/usr/bin/python3 -m http.server 2222",
                           "unit": "glm5-other-app.service", "uid": 0}]}
    assert v.glm5_host_refusals(v.glm5_host_items([item]), _probe(listeners=listeners)) == [
        "vllm_service_port (glm5_api_port) = 2222 is in use by '/usr/bin/python3 -m http.server 2222'"
        " (pid 41, glm5-other-app.service), not by vllm-glm-5.service; expected a free port or the service's own."]
    # Its own unit holds it: fine. The project's router holds it: named.
    own = {"2222": [{"pid": 7, "command": "vllm serve", "unit": "vllm-glm-5.service", "uid": 999}]}
    assert v.glm5_host_refusals(v.glm5_host_items([item]), _probe(listeners=own)) == []
    router = {"2222": [{"pid": 8, "command": "/opt/glm5-router/bin/vllm-router --port 2222",
                        "unit": "glm5-vllm-router.service", "uid": 998}]}
    lines = v.glm5_host_refusals(v.glm5_host_items([item]), _probe(listeners=router))
    assert "(pid 8, glm5-vllm-router.service)" in lines[0]
    # A process that cannot be read (another user's, no CAP_SYS_PTRACE).
    unread = {"2222": [{"pid": None, "command": "", "unit": "", "uid": 1001}]}
    assert "a process of uid 1001" in v.glm5_host_refusals(v.glm5_host_items([item]), _probe(listeners=unread))[0]


def test_rename_the_old_unit_of_the_same_role_may_hold_the_port(v):
    item = _port(v, "api", 8000, unit="vllm-glm-5b.service", own_glob="/etc/glm5/*.cmdline", own_units=".*")
    old = {"8000": [{"pid": 7, "command": "vllm serve", "unit": "vllm-glm-5.service", "uid": 999}]}
    recorded = _probe(listeners=old, glob_units=["vllm-glm-5.service"])
    assert v.glm5_host_refusals(v.glm5_host_items([item]), recorded) == []
    # Without the role's record of that unit (another program named vllm-*): refused.
    assert v.glm5_host_refusals(v.glm5_host_items([item]), _probe(listeners=old, glob_units=[]))


# --- settings no role declares ------------------------------------------------------


def test_unknown_settings_warned_with_the_nearest_name(v):
    declared = v.glm5_declared_settings(str(ROOT / "roles"))
    assert "glm5_tensor_parallel_size" in declared["names"] and "glm5_" in declared["prefixes"]
    assert "glm5_refusals" in declared["names"]  # set by the project's tasks
    warnings = v.glm5_unknown_settings(
        ["glm5_tensor_paralel_size", "vllm_service_prot", "glm5_tensor_parallel_size", "ansible_host", "vault_x",
         "glm5__validate", "model_dirr", "glm5_zzzzzz"], declared)
    assert warnings == [
        "glm5_tensor_paralel_size is set, but no role declares it; did you mean glm5_tensor_parallel_size?",
        "glm5_zzzzzz is set, but no role declares it; no role reads it.",
        "model_dirr is set, but no role declares it; did you mean model_dir?",
        "vllm_service_prot is set, but no role declares it; did you mean vllm_service_port?",
    ]


def test_fixture_and_example_inventories_declare_nothing_unknown(v):
    import yaml

    declared = v.glm5_declared_settings(str(ROOT / "roles"))
    names: set[str] = set()
    inventories = [*ROOT.glob("molecule/fixtures/group_vars/*/*.yml"),
                   *ROOT.glob("inventory/production/group_vars/*/*.yml")]
    for path in inventories:
        names |= set(yaml.safe_load(path.read_text()) or {})
    assert names and v.glm5_unknown_settings(names, declared) == []


# --- role vllm_service's flag policy ---------------------------------------------------


@pytest.fixture(scope="module")
def flag_policy() -> dict[str, str]:
    import yaml

    return yaml.safe_load((ROOT / "roles/vllm_service/vars/main.yml").read_text())["vllm_service_refused_flags"]


@pytest.mark.parametrize(("args", "shown"), [
    (["--trust-remote-code"], "--trust-remote-code"),
    (["--trust_remote_code"], "--trust_remote_code (read by vLLM as --trust-remote-code)"),
    (["--trust-remote"], "--trust-remote (read by vLLM as --trust-remote-code)"),
    (["--hf-token=hf_secret"], "--hf-token"),
    (["--enable-prompt-embeds"], "--enable-prompt-embeds"),
    (["--allowed-local-media-path", "/"], "--allowed-local-media-path"),
    (["--uds=/run/x.sock"], "--uds"),
])
def test_refused_flags(policy, flag_policy, args, shown):
    lines = policy.vllm_service_flag_refusals(args, flag_policy, False)
    assert len(lines) == 1 and lines[0].startswith(f"vllm_service_extra_args sets {shown}, which "), lines
    assert "hf_secret" not in lines[0]


def test_trust_remote_code_allowed_by_its_switch(policy, flag_policy):
    assert policy.vllm_service_flag_refusals(["--trust-remote-code"], flag_policy, True) == []
    assert "vllm_service_allow_trust_remote_code: true" in policy.vllm_service_flag_refusals(
        ["--trust-remote-code"], flag_policy, False)[0]
    # The switch allows that flag only.
    assert policy.vllm_service_flag_refusals(["--enable-prompt-embeds"], flag_policy, True)


@pytest.mark.parametrize("args", [["--enforce-eager"], ["--max-num-seqs", "64"], ["--trust"], ["-tp"], "--uds"])
def test_other_flags_pass(policy, flag_policy, args):
    assert policy.vllm_service_flag_refusals(args, flag_policy, False) == []


def test_environment_policy(policy):
    import yaml

    role_vars = yaml.safe_load((ROOT / "roles/vllm_service/vars/main.yml").read_text())
    refused = role_vars["vllm_service_refused_environment"]
    lines = policy.vllm_service_environment_refusals(
        {"VLLM_SERVER_DEV_MODE": "1", "HF_HUB_OFFLINE": "0", "HF_TOKEN": "", "NCCL_DEBUG": "INFO",
         "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "0", "TRANSFORMERS_OFFLINE": "1"}, refused)
    assert [line.split(",")[0].split(" which")[0] for line in lines] == [
        "vllm_service_environment sets HF_HUB_OFFLINE to another value than 1",
        "vllm_service_environment sets HF_TOKEN",
        "vllm_service_environment sets VLLM_SERVER_DEV_MODE",
    ]


# --- module glm5_host_probe -------------------------------------------------------------


def test_probe_resolves_links(probe, tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    answers = probe.resolve([str(tmp_path / "link" / "not-yet"), str(tmp_path / "real")])
    expected = {"realpath": str(tmp_path / "real" / "not-yet"), "exists": False}
    assert answers[str(tmp_path / "link" / "not-yet")] == expected
    assert answers[str(tmp_path / "real")]["exists"] is True


def test_probe_loads_ca_bundles_as_openssl_does(probe, tmp_path):
    bundle = Path(ssl.get_default_verify_paths().openssl_cafile or "/etc/ssl/certs/ca-certificates.crt")
    if not bundle.is_file():
        pytest.skip("no system CA bundle here")
    assert probe.load_pem(str(bundle))["certificates"] > 0
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    assert probe.load_pem(str(garbage))["error"]
    text = tmp_path / "text.pem"
    text.write_text("hello\n")
    answer = probe.load_pem(str(text))
    assert answer["certificates"] == 0 and answer["error"]
    assert probe.load_pem(str(tmp_path)) == {"exists": True, "is_file": False, "certificates": 0, "error": ""}


def test_probe_finds_the_listener_and_its_command(probe):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        sockets = {i: p for i, p in probe.listening_sockets().items() if p[0] == port}
        assert sockets
        owners = probe.socket_owners(set(sockets))
        pids = {pid for pids in owners.values() for pid in pids}
        import os

        assert os.getpid() in pids
        assert "python" in probe.process(os.getpid())["command"]


def test_probe_reads_sshd_config(probe, tmp_path):
    (tmp_path / "sshd_config.d").mkdir()
    (tmp_path / "sshd_config").write_text(f"Include {tmp_path}/sshd_config.d/*.conf\n#Port 2\nPort 2200\n")
    (tmp_path / "sshd_config.d" / "a.conf").write_text("ListenAddress 0.0.0.0:2201\nListenAddress [::]:2202\n")
    ports = probe.sshd_config_ports(tmp_path / "sshd_config")
    assert set(ports) == {2200, 2201, 2202}
    assert ports[2200].endswith("sshd_config: Port 2200")
