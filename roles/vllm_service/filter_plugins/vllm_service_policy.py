"""The policy for security-relevant vLLM flags and environment variables of the service.

vllm_service_flag_refusals: the words of vllm_service_extra_args that name a flag of
vllm_service_refused_flags (vars/main.yml; docs/service.md, "Security-relevant flags"),
written as vLLM's parser reads them (--flag=value, under_scores, an unambiguous
abbreviation of it); one line each, with the reason. --trust-remote-code is allowed by
vllm_service_allow_trust_remote_code.

vllm_service_environment_refusals: the names of vllm_service_environment that the policy
refuses (vllm_service_refused_environment), or that switch the service's offline mode
off (HF_HUB_OFFLINE, TRANSFORMERS_OFFLINE other than 1); never their values.
"""

from __future__ import annotations

from typing import Any

# Values of an environment switch that leave it off (vLLM reads these as false).
OFF = frozenset({"", "0", "false", "False", "no"})
# Names whose only accepted value is 1 (the unit sets them to 1).
MUST_BE_ONE = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
# The shortest abbreviation matched against the policy (argparse accepts any unambiguous
# prefix; shorter ones name several of vLLM's flags, which its parser refuses itself).
MIN_ABBREVIATION = 8


def _flag(word: str) -> str:
    return word.split("=", 1)[0].replace("_", "-")


def vllm_service_flag_refusals(extra_args: Any, policy: Any, allow_trust_remote_code: Any = False) -> list[str]:
    """One line per word of ``extra_args`` that names a refused flag of ``policy``.

    ``policy``: {flag: why it is refused}. --trust-remote-code passes with
    ``allow_trust_remote_code``.
    """
    if not isinstance(extra_args, list):
        return []
    flags = {str(f): str(w) for f, w in (policy or {}).items()}
    allowed = {"--trust-remote-code"} if str(allow_trust_remote_code).lower() in ("true", "yes", "on", "1") else set()
    lines: list[str] = []
    seen: set[str] = set()
    for word in (str(w) for w in extra_args):
        if not word.startswith("--"):
            continue
        written = _flag(word)
        if written in flags:
            target = written
        else:
            matches = [f for f in flags if f.startswith(written)] if len(written) >= MIN_ABBREVIATION else []
            if len(matches) != 1:
                continue
            target = matches[0]
        if target in allowed or target in seen:
            continue
        seen.add(target)
        raw = word.split("=", 1)[0]
        shown = target if raw == target else f"{raw} (read by vLLM as {target})"
        if target == "--trust-remote-code":
            expected = "no such flag, or vllm_service_allow_trust_remote_code: true"
        else:
            expected = "no such flag (docs/service.md, Security-relevant flags)"
        lines.append(f"vllm_service_extra_args sets {shown}, which {flags[target]}; expected {expected}.")
    return lines


def vllm_service_environment_refusals(environment: Any, policy: Any) -> list[str]:
    """One line per name of ``environment`` that ``policy`` ({name: why}) refuses, or that
    switches the offline mode off; the values are never shown."""
    if not isinstance(environment, dict):
        return []
    refused = {str(k): str(v) for k, v in (policy or {}).items()}
    lines: list[str] = []
    for name in sorted(str(k) for k in environment):
        value = str(environment[name])
        if name in MUST_BE_ONE and value != "1":
            lines.append(
                f"vllm_service_environment sets {name} to another value than 1, which lets the service download"
                f" from the hub; expected {name} left out (the unit sets it to 1)."
            )
        elif name in refused and (value not in OFF or name.endswith(("_TOKEN", "_KEY"))):
            lines.append(f"vllm_service_environment sets {name}, which {refused[name]}; expected it left out.")
    return lines


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "vllm_service_environment_refusals": vllm_service_environment_refusals,
            "vllm_service_flag_refusals": vllm_service_flag_refusals,
        }
