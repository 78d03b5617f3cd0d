"""The renderer of docs/validation-refusals.md's table (refusal_table.py), on lines as
the validation phase writes them."""

from __future__ import annotations

from refusal_table import SECRET_MARK, line_variable, render


def test_the_variable_and_its_value_from_the_line_and_the_row():
    overrides = {"glm5_api_port": 0, "glm5_tensor_parallel_size": "8 "}
    assert line_variable("vllm_service_port (glm5_api_port) = 0 is refused; expected 1-65535.", overrides) == (
        "glm5_api_port", "`0`")
    assert line_variable("glm5_tensor_parallel_size = '8 ' is refused; expected a whole number", overrides) == (
        "glm5_tensor_parallel_size", '`"8 "`')
    # A derived variable the row did not set: named, its value left to the message.
    assert line_variable("model_dir (glm5_model_dir) = '/x' is refused", overrides) == ("model_dir", "")
    assert line_variable("Refused.", overrides) == ("", "")
    assert line_variable("glm5_served_model_name is long", {"glm5_served_model_name": "n" * 300}) == (
        "glm5_served_model_name", '`"nnnnnnnnnnnnnnnnnnn... (302 characters)`')


def test_secrets_and_table_syntax_never_leak_into_the_doc():
    overrides = {"vllm_service_api_key": f"{SECRET_MARK}\nX=1", "exposure_allowed_sources": ["a|b"]}
    lines = [f"vllm_service_api_key = {SECRET_MARK} is refused", "exposure_allowed_sources = 'a|b'"]
    table = render({"key": {"refusal_s": 4.2, "overrides": overrides, "lines": lines}})
    assert SECRET_MARK not in table
    rows = table.splitlines()
    assert len(rows) == 4
    assert rows[2] == ('| key | `vllm_service_api_key` | `"***\\nX=1"`'
                       " | vllm_service_api_key = *** is refused | 4.2 |")
    assert "a\\|b" in rows[3] and rows[3].count(" | ") == 4
