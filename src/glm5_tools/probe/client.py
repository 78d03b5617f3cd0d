"""Minimal OpenAI-compatible HTTP client (standard library only)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any


class ApiError(RuntimeError):
    """An HTTP error or a malformed answer from the server."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ApiClient:
    """Talks to ``base_url`` (e.g. ``http://127.0.0.1:8000``) with a bearer key."""

    base_url: str
    api_key: str | None = None
    timeout: float = 120.0

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        url = self.base_url.rstrip("/") + path
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.api_key:
            req.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raise ApiError(f"{method} {path}: HTTP {exc.code}", status=exc.code) from exc
        except (urllib.error.URLError, OSError) as exc:
            raise ApiError(f"{method} {path}: {exc}") from exc
        if not raw:
            return None
        try:
            return json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ApiError(f"{method} {path}: answer is not JSON") from exc

    def status(self, path: str) -> int:
        """HTTP status of a GET, without raising on 4xx/5xx."""
        try:
            self._request("GET", path)
        except ApiError as exc:
            if exc.status is None:
                raise
            return exc.status
        return 200

    def model_ids(self) -> list[str]:
        answer = self._request("GET", "/v1/models")
        try:
            return [str(m["id"]) for m in answer["data"]]
        except (KeyError, TypeError) as exc:
            raise ApiError("/v1/models: no data[].id in the answer") from exc

    def models(self) -> list[dict[str, Any]]:
        answer = self._request("GET", "/v1/models")
        data = answer.get("data") if isinstance(answer, dict) else None
        if not isinstance(data, list):
            raise ApiError("/v1/models: no data list in the answer")
        return [m for m in data if isinstance(m, dict)]

    def chat(self, model: str, prompt: str, max_tokens: int = 64) -> str:
        """Greedy chat completion; returns the assistant's content."""
        answer = self._request(
            "POST",
            "/v1/chat/completions",
            {
                "model": model,
                "messages": [{"role": "user", "content": prompt}],
                "temperature": 0,
                "max_tokens": max_tokens,
                # GLM-5 thinks by default; the probe wants the answer itself.
                "chat_template_kwargs": {"enable_thinking": False},
            },
        )
        try:
            content = answer["choices"][0]["message"].get("content")
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            raise ApiError("/v1/chat/completions: no choices[0].message") from exc
        return str(content or "")

    def prompt_logprobs(self, model: str, text: str) -> list[float | None]:
        """Per-token log-probabilities of ``text`` itself (completions echo + logprobs)."""
        answer = self._request(
            "POST",
            "/v1/completions",
            {
                "model": model,
                "prompt": text,
                "max_tokens": 1,
                "temperature": 0,
                "echo": True,
                "logprobs": 0,
            },
        )
        try:
            values = answer["choices"][0]["logprobs"]["token_logprobs"]
        except (KeyError, IndexError, TypeError) as exc:
            raise ApiError("/v1/completions: no choices[0].logprobs.token_logprobs") from exc
        if not isinstance(values, list):
            raise ApiError("/v1/completions: token_logprobs is not a list")
        return [None if v is None else float(v) for v in values]
