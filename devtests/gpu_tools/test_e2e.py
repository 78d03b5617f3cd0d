"""tools/gpu/e2e.py, the end-to-end checks of a served model: what runs without a GPU.

A small stand-in of vLLM's OpenAI server (HTTP, the fields e2e.py reads: prompt
log-probs with `echo`, greedy tokens with their top-2, /metrics) answers from a made-up
model whose next-token distribution depends on the last two tokens; its `lookahead`
variant also reads the token after each position, the fault the causality check
exists for. The comparison's arithmetic is checked on arrays whose KL is known.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
VOCAB = 16


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("e2e", ROOT / "tools" / "gpu" / "e2e.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["e2e"] = mod
    spec.loader.exec_module(mod)
    return mod


e2e = load()


def next_logprobs(prefix: list[int], peek: int | None = None) -> np.ndarray:
    """The made-up model: log-probs of the token after `prefix` (peek: the fault's look-ahead)."""
    rng = np.random.default_rng(prefix[-1] * 131 + (prefix[-2] if len(prefix) > 1 else 7) + 1000 * (peek or 0))
    logits = rng.normal(size=VOCAB) * 3
    return np.asarray(logits - np.log(np.exp(logits).sum()))


class StandIn(BaseHTTPRequestHandler):
    lookahead = False
    drafts = 0

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _send(self, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        StandIn.drafts += 10
        text = (
            "# HELP vllm:spec_decode_num_drafts_total drafts\n"
            f'vllm:spec_decode_num_drafts_total{{model_name="glm-5"}} {StandIn.drafts}\n'
            f'vllm:spec_decode_num_drafts_created{{model_name="glm-5"}} 1.7e9\n'
            f'vllm:spec_decode_num_accepted_tokens_total{{model_name="glm-5"}} {StandIn.drafts * 1.5}\n'
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="0"}} {StandIn.drafts}\n'
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="1"}} {StandIn.drafts / 2}\n'
        )
        self._send(text.encode(), "text/plain")

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert self.headers.get("Authorization") == "Bearer sekrit"
        ids: list[int] = body["prompt"]
        k = body.get("logprobs") or 0

        def top(lp: np.ndarray, extra: int | None = None) -> dict[str, float]:
            best = np.argsort(-lp)[:k]
            out = {f"token_id:{int(t)}": float(lp[t]) for t in best}
            if extra is not None and extra < VOCAB:
                out[f"token_id:{extra}"] = float(lp[extra])
            return out

        if body.get("echo"):
            tops: list[dict[str, float] | None] = [None]
            for i in range(len(ids) - 1):
                peek = ids[i + 1] if self.lookahead and i + 1 < len(ids) else None
                tops.append(top(next_logprobs(ids[: i + 1], peek), ids[i + 1]))
            tokens = [f"token_id:{t}" for t in ids]
        else:
            seq, tops, tokens = list(ids), [], []
            for _ in range(body["max_tokens"]):
                lp = next_logprobs(seq)
                t = int(np.argmax(lp))
                tops.append(top(lp))
                tokens.append(f"token_id:{t}")
                seq.append(t)
        choice = {"text": "", "logprobs": {"tokens": tokens, "top_logprobs": tops}, "finish_reason": "length"}
        self._send(json.dumps({"choices": [choice]}).encode())


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[str]:
    handler = type("H", (StandIn,), {"lookahead": getattr(request, "param", False)})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


PROMPTS = [{"ids": [1, 2, 3, 4, 5, 6, 7]}, {"ids": [9, 8, 7, 6, 5]}]


def test_query_writes_distributions_greedy_and_mtp_counters(server: str, tmp_path: Path) -> None:
    (tmp_path / "p.json").write_text(json.dumps(PROMPTS))
    (tmp_path / "key").write_text("sekrit\n")
    rc = e2e.main(
        [
            "query",
            "--url",
            server,
            "--key-file",
            str(tmp_path / "key"),
            "--vocab",
            str(VOCAB),
            "--prompts",
            str(tmp_path / "p.json"),
            "--out",
            str(tmp_path / "out" / "s"),
            "--max-tokens",
            "4",
            "--repeats",
            "2",
            "--together",
        ]
    )
    assert rc == 0
    report = json.loads((tmp_path / "out" / "s.json").read_text())
    arrays = np.load(tmp_path / "out" / "s.npz")
    lp0 = arrays["lp0"]
    assert lp0.shape == (6, VOCAB)
    # the whole vocabulary was asked for: row i is the model's distribution after ids[: i + 1]
    np.testing.assert_allclose(lp0[2], next_logprobs([1, 2, 3]), rtol=1e-6)
    row = report["prompts"][0]
    seq = [1, 2, 3, 4, 5, 6, 7]
    for _ in range(4):
        seq.append(int(np.argmax(next_logprobs(seq))))
    assert row["greedy_ids"] == seq[7:] and row["repeats_equal"] is True
    assert all(m > 0 for m in row["greedy_margins"]) and isinstance(row["decode_s_per_token"], float)
    assert report["together_vs_sequential_max_abs_diff"] == [0.0, 0.0]
    assert report["mtp"]["drafts"] == 10 and report["mtp"]["mean_acceptance_length"] == 2.5
    assert report["mtp"]["acceptance_per_position"] == [1.0, 0.5]
    assert "vllm:spec_decode_num_drafts_created" not in report["spec_decode"]


def test_query_top_k_leaves_the_rest_minus_infinity(
    server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_API_KEY", "sekrit")
    (tmp_path / "p.json").write_text(json.dumps(PROMPTS[:1]))
    assert (
        e2e.main(
            [
                "query",
                "--url",
                server,
                "--vocab",
                str(VOCAB),
                "--prompts",
                str(tmp_path / "p.json"),
                "--out",
                str(tmp_path / "s"),
                "--logprobs",
                "3",
                "--max-tokens",
                "1",
            ]
        )
        == 0
    )
    lp0 = np.load(tmp_path / "s.npz")["lp0"]
    # the top 3 and the prompt token itself, as vLLM lists them
    assert all(3 <= int(np.isfinite(r).sum()) <= 4 for r in lp0)


@pytest.mark.parametrize("server", [False], indirect=True)
def test_causal_passes_a_causal_server(server: str, tmp_path: Path) -> None:
    s = e2e.Server(server, key="sekrit")
    report = e2e.causal_report(s, list(range(1, 12)), [3, 6, 10], VOCAB)
    assert report["verdict"].startswith("PASS")
    assert all(r["max_abs_diff_before_cut"] == 0 for r in report["cuts"])


@pytest.mark.parametrize("server", [True], indirect=True)
def test_causal_fails_a_server_that_reads_the_next_token(server: str, tmp_path: Path) -> None:
    (tmp_path / "p.json").write_text(json.dumps([{"ids": list(range(1, 12))}]))
    (tmp_path / "key").write_text("sekrit")
    rc = e2e.main(
        [
            "causal",
            "--url",
            server,
            "--key-file",
            str(tmp_path / "key"),
            "--vocab",
            str(VOCAB),
            "--prompts",
            str(tmp_path / "p.json"),
            "--cuts",
            "3,6",
            "--out",
            str(tmp_path / "c.json"),
        ]
    )
    report = json.loads((tmp_path / "c.json").read_text())
    assert rc == 1 and report["verdict"].startswith("FAIL")
    # the look-ahead moves position m - 1, the one that sees the changed token
    assert all(r["first_differing_positions"] == [r["cut"] - 1] for r in report["cuts"])


def test_causal_refuses_a_cut_outside_the_prompt(server: str) -> None:
    with pytest.raises(ValueError, match="cut 9"):
        e2e.causal_report(e2e.Server(server, key="sekrit"), [1, 2, 3], [9], VOCAB)


def test_agreement_kl_and_top1() -> None:
    ref = np.log(np.array([[0.5, 0.5], [0.9, 0.1]]))
    got = np.log(np.array([[0.5, 0.5], [0.1, 0.9]]))
    a = e2e.agreement(got, ref)
    kl = 0.9 * np.log(0.9 / 0.1) + 0.1 * np.log(0.1 / 0.9)
    assert a["kl_max"] == pytest.approx(kl, abs=1e-6) and a["kl_mean"] == pytest.approx(kl / 2, abs=1e-6)
    assert a["top1"] == 0.5  # row 0 ties (argmax 0 on both), row 1 differs
    # -inf (a token the server did not list) counts as probability 0, not NaN
    assert np.isfinite(e2e.agreement(np.array([[0.0, -np.inf]]), np.array([[0.0, -5.0]]))["kl_mean"])


def _oracles(n_tokens: int, topk: int) -> tuple[dict[str, dict[int, np.ndarray]], np.ndarray]:
    rng = np.random.default_rng(0)
    truth = rng.normal(size=(n_tokens, 8)) * 2
    near = truth + rng.normal(size=truth.shape) * 0.05
    wrong = truth.copy()
    wrong[topk:] = np.roll(truth[topk:], 1, axis=-1)  # a different selection past index_topk
    return {"llama.cpp": {0: truth}, "reference-fp8-indexer": {0: near}, "reference-off-by-one": {0: wrong}}, truth


def test_verdict_passes_a_close_server_and_fails_a_wrong_one() -> None:
    topk = 4
    oracle, truth = _oracles(12, topk)
    rng = np.random.default_rng(1)
    good = (truth + rng.normal(size=truth.shape) * 0.03)[:-1]
    bad = oracle["reference-off-by-one"][0][:-1]
    report = e2e.compare_report(
        {"good": {0: good}, "bad": {0: bad}},
        {"good": {0: [1]}, "bad": {0: [2]}},
        oracle,
        topk,
        baseline="good",
        pairs=[("good", "bad")],
        must_fail=["reference-off-by-one"],
    )
    assert report["verdicts"]["good"].startswith("PASS")
    assert report["verdicts"]["bad"].startswith("FAIL")
    assert report["verdicts"]["reference-off-by-one"].startswith("FAIL")
    assert report["servers"]["bad"]["0"]["greedy_equal_to_baseline"] is False
    assert report["servers"]["good"]["0"]["vs llama.cpp"]["from_topk"]["top1"] == 1.0
    assert report["pairs"]["good vs bad"]["0"]["kl_mean"] > 0.1


def test_verdict_says_when_the_check_cannot_catch_a_fault() -> None:
    topk = 4
    oracle, truth = _oracles(12, topk)
    oracle["reference-off-by-one"] = {0: truth + 0.0}  # a "fault" that changes nothing
    report = e2e.compare_report({}, {}, oracle, topk, must_fail=["reference-off-by-one"])
    assert "cannot catch" in report["verdicts"]["reference-off-by-one"]


def test_compare_from_files(tmp_path: Path) -> None:
    topk = 4
    oracle, truth = _oracles(12, topk)
    arrays = {f"{k}/0": v[0] for k, v in oracle.items()} | {"index_topk": np.array(topk)}
    np.savez(tmp_path / "o.npz", **arrays)  # type: ignore[arg-type]
    (tmp_path / "r").mkdir()
    np.savez(tmp_path / "r" / "a.npz", lp0=truth[:-1])
    (tmp_path / "r" / "a.json").write_text(json.dumps({"prompts": [{"greedy_ids": [1, 2]}]}))
    (tmp_path / "r" / "vllm-mtp0-eager").mkdir()  # tools/gpu/run's results folder of a server
    np.savez(tmp_path / "r" / "vllm-mtp0-eager" / "e2e.npz", lp0=oracle["reference-off-by-one"][0][:-1])
    rc = e2e.main(
        [
            "compare",
            "--results",
            str(tmp_path / "r"),
            "--servers",
            "a,missing,vllm-mtp0-eager",
            "--oracles",
            str(tmp_path / "o.npz"),
            "--out",
            str(tmp_path / "rep.json"),
            "--must-fail",
            "reference-off-by-one",
        ]
    )
    report = json.loads((tmp_path / "rep.json").read_text())
    assert report["verdicts"]["a"].startswith("PASS") and report["verdicts"]["missing"] == "NO RESULT"
    assert report["verdicts"]["vllm-mtp0-eager"].startswith("FAIL")
    assert rc == 1  # a server without results fails the run


def test_repeat_finds_the_first_differing_position(tmp_path: Path) -> None:
    a = np.zeros((6, 4), dtype=np.float32)
    b = a.copy()
    b[4, 1] = 0.5
    b[5, 0] = -np.inf  # not listed in one: not a difference
    np.savez(tmp_path / "a.npz", lp0=a)
    np.savez(tmp_path / "b.npz", lp0=b)
    rc = e2e.main(
        [
            "repeat",
            f"x={tmp_path / 'a.npz'}:lp0,{tmp_path / 'b.npz'}:lp0",
            "--index-topk",
            "3",
            "--out",
            str(tmp_path / "r.json"),
        ]
    )
    r = json.loads((tmp_path / "r.json").read_text())["x"]
    assert rc == 1 and r["first_differing_position"] == 4 and r["before_topk"]["max_abs_diff"] == 0.0
    assert r["from_topk"]["max_abs_diff"] == 0.5
    assert e2e.main(["repeat", f"y={tmp_path / 'a.npz'}:lp0,{tmp_path / 'a.npz'}:lp0"]) == 0


def test_spec_counters_without_mtp_are_empty() -> None:
    assert e2e.acceptance(e2e.spec_counters("vllm:num_requests_running 0\n")) == {}


def test_prompts_are_the_recorded_seeded_ones(tmp_path: Path) -> None:
    held = ROOT / "tools" / "gpu" / "e2e-prompts.json"
    rc = e2e.main(["prompts", "--include", str(held), "--seeded", "4096:10,5120:11", "--out", str(tmp_path / "p.json")])
    got = json.loads((tmp_path / "p.json").read_text())
    assert rc == 0 and [len(p["ids"]) for p in got] == [128, 256, 200, 23, 4096, 5120]
    # the held prompts' seeded ones are the generator's (seeds 0, 1, 2), as the CPU oracles make them
    assert [p["ids"] for p in got[:3]] == [e2e.seeded_prompt(n, s, 2048) for n, s in ((128, 0), (256, 1), (200, 2))]
    assert got[4]["ids"][:3] == e2e.seeded_prompt(4096, 10, 2048)[:3]
    with pytest.raises(ValueError, match="at least 2"):
        e2e.seeded_prompt(1, 0, 2048)


def test_the_run_steps_query_the_current_server(server: str, tmp_path: Path) -> None:
    """tools/gpu/run e2e:full / e2e:mtp / e2e:causal against the server the run started
    (here the stand-in, as if serve:vllm had started it): the files land in its results."""
    g = tmp_path / "gpu"
    g.mkdir()
    (g / "current").write_text("vllm-mtp0\n")
    (g / "key").write_text("sekrit\n")
    (tmp_path / "p.json").write_text(json.dumps([{"ids": [1, 2, 3, 4, 5]}, {"ids": list(range(1, 12))}]))
    env = dict(
        os.environ,
        GPU_ROOT=str(g),
        OUT=str(tmp_path / "out"),
        GPU_PYTHON=sys.executable,
        SLICE_PORT=server.rsplit(":", 1)[1],
        E2E_PROMPTS=str(tmp_path / "p.json"),
        E2E_CUTS="3,6",
    )
    proc = subprocess.run(
        [str(ROOT / "tools" / "gpu" / "run"), "e2e:full", "e2e:mtp", "e2e:causal"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    results = g / "results" / "vllm-mtp0"
    full = json.loads((results / "e2e.json").read_text())
    assert len(full["prompts"]) == 2 and full["together_vs_sequential_max_abs_diff"] == [0.0, 0.0]
    assert np.load(results / "e2e.npz")["lp1"].shape == (10, 2048)
    mtp = json.loads((results / "e2e-mtp.json").read_text())
    assert len(mtp["prompts"][0]["greedy_ids"]) == 128 and mtp["mtp"]["drafts"] > 0
    assert json.loads((results / "e2e-causal.json").read_text())["verdict"].startswith("PASS")
    assert (tmp_path / "out" / "results.tar.gz").exists()
    proc = subprocess.run(
        [str(ROOT / "tools" / "gpu" / "run"), "e2e:nonsense"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode != 0 and "unknown set nonsense" in proc.stdout


def test_oracles_refuses_an_unknown_name_before_loading_anything(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"unknown \['reference-fp16'\]"):
        e2e.main(
            [
                "oracles",
                "--gguf",
                "none.gguf",
                "--prompts",
                "none.json",
                "--out",
                str(tmp_path / "o.npz"),
                "--only",
                "llama.cpp,reference-fp16",
            ]
        )
