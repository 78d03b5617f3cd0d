"""A strict reader of the Prometheus text exposition format (0.0.4), enough to check the
GPU exporter's output: every sample belongs to a family announced by HELP and TYPE
before it, names and label names are valid, values are numbers, no family appears
twice. Used by tests/test_gpu_exporter.py and devtests/gpu_exporter/."""

from __future__ import annotations

import re

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
SAMPLE = re.compile(rf"^({NAME})(\{{(?:{LABEL})(?:,{LABEL})*\}})? (\S+)$")
LABEL_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"')

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), value)


def parse(text: str) -> tuple[Samples, dict[str, str]]:
    """The samples {(name, labels): value} and the families {name: type}; AssertionError when malformed."""
    assert text.endswith("\n"), "the exposition must end with a newline"
    samples: Samples = {}
    types: dict[str, str] = {}
    helped: set[str] = set()
    current = ""
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name = line.split(" ", 3)[2]
            assert re.fullmatch(NAME, name), line
            assert name not in helped, f"family {name} twice"
            helped.add(name)
            current = name
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert name == current and name not in types, line
            assert kind in {"counter", "gauge", "histogram", "summary", "untyped"}, line
            types[name] = kind
            continue
        match = SAMPLE.match(line)
        assert match, f"not a sample line: {line!r}"
        name, labels, value = match.groups()
        assert name == current and name in types, f"{name} outside its family"
        pairs = frozenset((k, _unescape(v)) for k, v in LABEL_PAIR.findall(labels or ""))
        assert (name, pairs) not in samples, f"duplicate sample {line}"
        samples[(name, pairs)] = float(value)
    return samples, types


def value(samples: Samples, metric: str, /, **labels: str) -> float:
    """The one sample of ``metric`` whose labels include ``labels``."""
    found = [v for (n, pairs), v in samples.items() if n == metric and set(labels.items()) <= set(pairs)]
    assert len(found) == 1, f"{metric}{labels}: {len(found)} samples"
    return found[0]


def names(samples: Samples) -> set[str]:
    return {n for n, _ in samples}
