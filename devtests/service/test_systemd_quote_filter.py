"""The quoting filters of role glm5 (filter_plugins/glm5_systemd_quote.py) on their own:
what they write and what they refuse. devtests/runner/test_systemd_quote_parser.py feeds
the same table to systemd's own parser in a container."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "roles/glm5/filter_plugins"))

import glm5_systemd_quote as q  # noqa: E402


def test_env_file_line_escapes_the_four_specials_only():
    assert q.env_file_line("K", 'a"b\\c$d`e') == 'K="a\\"b\\\\c\\$d\\`e"'
    assert q.env_file_line("K", "it's 100% #;") == 'K="it\'s 100% #;"'
    assert q.env_file_line("K", "") == 'K=""'


def test_unit_environment_doubles_percent_and_escapes_quote_and_backslash():
    assert q.unit_environment("K", 'x%iy"z\\') == '"K=x%%iy\\"z\\\\"'
    assert q.unit_environment("K", "$HOME") == '"K=$HOME"'


def test_exec_args_quote_each_word():
    assert q.exec_args(["/usr/bin/x y", "$HOME", "50%", 'a"b', 8000]) == (
        '"/usr/bin/x y" "$$HOME" "50%%" "a\\"b" "8000"')
    with pytest.raises(q.AnsibleFilterError, match="list of words"):
        q.exec_args("not a list")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("ab\nGLM5_INJECTED=pwned", "contains a newline at character 3 of 22"),
        ("ab\r", "contains a carriage return at character 3 of 3"),
        ("a\x00", "contains a NUL character at character 2 of 2"),
        ("\x1b[0m", "contains a control character (U+001B) at character 1 of 4"),
        ("x\x7f", "contains a control character (U+007F)"),
        (b"\xff".decode("utf-8", "surrogateescape"), "contains bytes that are not UTF-8"),
        ("\ufeffkey", "contains a byte order mark (U+FEFF)"),
        ("k\uffff", "contains a Unicode noncharacter (U+FFFF)"),
        ({"a": 1}, "must be a string or a number, got a dict"),
    ],
)
def test_unrepresentable_values_are_named_never_quoted(value, problem):
    assert problem in q.systemd_problem(value)
    secret_part = "GLM5_INJECTED"
    assert secret_part not in q.systemd_problem(value)
    with pytest.raises(q.AnsibleFilterError) as err:
        q.env_file_line("VLLM_API_KEY", value)
    if isinstance(value, str):
        assert value not in str(err.value) or value == ""


@pytest.mark.parametrize("value", ["tab\there", "ünïcödé ✓ 鍵", "x" * 200, 8000, 0.92, "", "\u0085"])
def test_representable_values_pass(value):
    assert q.systemd_problem(value) == ""


@pytest.mark.parametrize("name", ["1X", "A-B", "A B", "", "A=B", "Ä"])
def test_bad_names_refused(name):
    assert q.env_name_problem(name)
    with pytest.raises(q.AnsibleFilterError, match="not an environment variable name"):
        q.unit_environment(name, "v")


def test_bool_is_written_like_yaml():
    assert q.unit_environment("K", True) == '"K=true"'


@pytest.mark.parametrize(
    ("key", "problem"),
    [
        ("", "is empty"),
        ("ab\ncd", "contains a newline"),
        ("schlüssel", "outside printable ASCII (U+00FC) at character 5"),
        (" lead", "starts or ends with a space"),
        ("trail ", "starts or ends with a space"),
        (12345, "is a int, not a string"),
    ],
)
def test_http_token_problem(key, problem):
    assert problem in q.http_token_problem(key)


def test_http_token_accepts_printable_ascii():
    assert q.http_token_problem("a $ \\ \" ' % # ; ~ z" + "k" * 200) == ""


def test_environment_problems_name_the_variable_and_entry_only():
    got = q.environment_problems({"OK": "1", "BAD NAME": "x", "K": "sec\nret"}, "vllm_service_environment")
    assert got == [
        "vllm_service_environment: 'BAD NAME' is not an environment variable name "
        "(letters, digits and _, not starting with a digit)",
        "vllm_service_environment: the value of K contains a newline at character 4 of 7",
    ]
    assert q.environment_problems(["x"], "v") == ["v must be a mapping of variable names to values, got a list"]


def test_exec_problems_number_the_words():
    assert q.exec_problems(["--a", "b\x00", "c"], "vllm_service_extra_args") == [
        "vllm_service_extra_args: word 2 contains a NUL character at character 2 of 2"]
    assert q.exec_problems("--a b", "v") == ["v must be a list of words, got a str"]
