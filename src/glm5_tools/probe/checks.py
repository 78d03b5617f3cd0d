"""Fixed prompts with known answers, prompt perplexity, and the garbage detector.

The detector fails gibberish (broken tokens, symbol soup, repetition loops) *and*
fluent-but-wrong output: a grammatical answer that lacks the known answer is a
failure, which is what a wrong chat template, a wrong attention backend or a
mis-mapped GGUF tensor typically produces.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol

VerdictKind = Literal["ok", "empty", "gibberish", "repetitive", "wrong"]


@dataclass(frozen=True)
class FixedPrompt:
    """A prompt whose greedy answer must match ``expected`` (a regular expression)."""

    name: str
    prompt: str
    expected: str


@dataclass(frozen=True)
class Verdict:
    kind: VerdictKind
    reason: str

    @property
    def ok(self) -> bool:
        return self.kind == "ok"


FIXED_PROMPTS: tuple[FixedPrompt, ...] = (
    FixedPrompt("capital", "What is the capital of France? Answer with one word.", r"\bparis\b"),
    FixedPrompt("sum", "What is 17 + 25? Answer with the number only.", r"\b42\b"),
    FixedPrompt(
        "proverb",
        "Complete the proverb with one word: An apple a day keeps the ___ away.",
        r"\bdoctors?\b",
    ),
    FixedPrompt(
        "week", "How many days are in a week? Answer with the number only.", r"\b(7|seven)\b"
    ),
    FixedPrompt(
        "gold", "What is the chemical symbol for gold? Answer with the symbol only.", r"\bau\b"
    ),
)

# Plain, predictable English: a healthy model scores a low perplexity on it.
PERPLEXITY_TEXT = (
    "The sun rises in the east and sets in the west. Every morning, people wake up, "
    "eat breakfast and go to work or to school. In the evening they come back home, "
    "cook dinner and spend time with their families before they go to sleep. "
    "On the weekend many of them rest, meet their friends or go for a walk in the park."
)

_WORD = re.compile(r"[^\W\d_]+", re.UNICODE)
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]")
_VOWELS = set("aeiouyAEIOUY")


def _wordlike(word: str) -> bool:
    if _CJK.search(word):
        return True
    if len(word) > 20:
        return False
    if len(word) <= 2:
        return True
    if not any(c in _VOWELS for c in word):
        return False
    # Mixed case inside a word ("xKqZ") is typical of broken byte-pair output.
    inner = word[1:]
    return not (any(c.isupper() for c in inner) and any(c.islower() for c in inner))


def gibberish_reason(text: str) -> str | None:
    """Why ``text`` is gibberish or a repetition loop, or None if it reads as language."""
    stripped = text.strip()
    if not stripped:
        return None
    bad = sum(1 for c in stripped if c == "\ufffd" or (ord(c) < 32 and c not in "\n\t\r"))
    if bad / len(stripped) > 0.02:
        return f"{bad} replacement/control characters"
    if len(stripped) >= 12:
        symbols = sum(
            1 for c in stripped if not (c.isalnum() or c.isspace() or c in ".,;:!?'\"-()")
        )
        if symbols / len(stripped) > 0.3:
            return f"{symbols} of {len(stripped)} characters are symbols"
    words = _WORD.findall(stripped)
    if len(words) >= 4:
        wordlike = sum(1 for w in words if _wordlike(w))
        if wordlike / len(words) < 0.7:
            return f"only {wordlike} of {len(words)} words look like words"
    lowered = [w.lower() for w in words]
    if len(lowered) >= 12:
        if len(set(lowered)) / len(lowered) < 0.3:
            return f"{len(set(lowered))} distinct words in {len(lowered)}"
        trigrams = Counter(zip(lowered, lowered[1:], lowered[2:], strict=False))
        gram, count = trigrams.most_common(1)[0]
        if count >= 4:
            return f"'{' '.join(gram)}' repeated {count} times"
    return None


def assess_answer(text: str, prompt: FixedPrompt) -> Verdict:
    """Judge one greedy answer: empty, gibberish, repetitive, wrong, or ok."""
    if not text.strip():
        return Verdict("empty", "empty answer")
    reason = gibberish_reason(text)
    if reason is not None:
        kind: VerdictKind = (
            "repetitive" if "repeated" in reason or "distinct" in reason else "gibberish"
        )
        return Verdict(kind, reason)
    if re.search(prompt.expected, text, re.IGNORECASE):
        return Verdict("ok", "expected answer present")
    snippet = text.strip().replace("\n", " ")[:80]
    return Verdict("wrong", f"fluent but wrong: expected /{prompt.expected}/, got {snippet!r}")


def perplexity_from_logprobs(logprobs: list[float | None]) -> float:
    """exp(-mean log p) over the tokens that have a log-probability (the first has none)."""
    values = [v for v in logprobs if v is not None]
    if not values:
        raise ValueError("no token log-probabilities")
    if any(math.isnan(v) or v > 1e-6 for v in values):
        raise ValueError("invalid log-probability (NaN or > 0)")
    return math.exp(-sum(values) / len(values))


class ProbeClient(Protocol):
    def chat(self, model: str, prompt: str, max_tokens: int = 64) -> str: ...

    def prompt_logprobs(self, model: str, text: str) -> list[float | None]: ...


@dataclass
class ProbeReport:
    model: str
    answers: list[dict[str, str]] = field(default_factory=list)
    perplexity: float | None = None
    perplexity_threshold: float = 0.0
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["ok"] = self.ok
        return data


def run_probe(
    client: ProbeClient,
    model: str,
    perplexity_threshold: float = 20.0,
    prompts: tuple[FixedPrompt, ...] = FIXED_PROMPTS,
    text: str = PERPLEXITY_TEXT,
) -> ProbeReport:
    """Ask every fixed prompt greedily and score the fixed text; collect failures."""
    report = ProbeReport(model=model, perplexity_threshold=perplexity_threshold)
    for prompt in prompts:
        answer = client.chat(model, prompt.prompt)
        verdict = assess_answer(answer, prompt)
        report.answers.append(
            {
                "name": prompt.name,
                "answer": answer,
                "verdict": verdict.kind,
                "reason": verdict.reason,
            }
        )
        if not verdict.ok:
            report.failures.append(f"{prompt.name}: {verdict.kind}: {verdict.reason}")
    try:
        report.perplexity = perplexity_from_logprobs(client.prompt_logprobs(model, text))
    except ValueError as exc:
        report.failures.append(f"perplexity: {exc}")
    else:
        if report.perplexity > perplexity_threshold:
            report.failures.append(
                f"perplexity: {report.perplexity:.2f} above the threshold {perplexity_threshold}"
            )
    return report
