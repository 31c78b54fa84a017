"""`oilbird replay` against a stub OpenAI-compatible server (replay is a client; the real server is
tested elsewhere): its counts, its errors, the spec-decode counter differences and bad input."""

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from oilbird.cli import main
from oilbird.errors import ConfigError, DatasetError
from oilbird.replay import ReplayError, ReplayOptions, run_replay, summarize, RequestOutcome
from oilbird.replay_metrics import metrics_url, parse_prometheus, spec_decode_delta

pytest.importorskip("openai")

# Per served request the stub's counters grow by these: acceptance 5/8, mean accepted length 1 + 5/2.
DRAFTS, DRAFT_TOKENS, ACCEPTED = 2, 8, 5


class _Stub(BaseHTTPRequestHandler):
    """Answers with one output token per word of the last message (or prompt); "BAD" gets a 400."""

    def log_message(self, *args):  # keep the test output clean
        pass

    def _send(self, status: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/v1/models" and self.server.list_models:
            models = [{"id": m, "object": "model", "created": 0, "owned_by": "stub"} for m in ("stub-a", "stub-b")]
            self._send(200, json.dumps({"object": "list", "data": models}).encode())
        elif self.path == "/metrics" and self.server.metrics:
            self._send(200, self.server.metrics_text().encode(), "text/plain; version=0.0.4")
        else:
            self._send(404, b'{"detail": "Not Found"}')

    def do_POST(self):
        payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.payloads.append((self.path, payload))
        chat = self.path == "/v1/chat/completions"
        text = payload["messages"][-1]["content"] if chat else payload["prompt"]
        if "BAD" in text:
            error = {"error": {"message": f"bad request: {text}", "type": "BadRequestError", "code": 400}}
            return self._send(400, json.dumps(error).encode())
        with self.server.lock:
            self.server.served += 1
        words = text.split()
        usage = {"prompt_tokens": 100, "completion_tokens": len(words), "total_tokens": 100 + len(words)}
        kind = "chat.completion" if chat else "text_completion"
        if not payload.get("stream"):
            choice = ({"index": 0, "message": {"role": "assistant", "content": " ".join(words)},
                       "finish_reason": "stop"} if chat else {"index": 0, "text": " ".join(words), "finish_reason": "stop"})
            body = {"id": "x", "object": kind, "created": 0, "model": payload["model"], "choices": [choice],
                    "usage": usage}
            return self._send(200, json.dumps(body).encode())
        self._stream(words, chat, usage if payload.get("stream_options", {}).get("include_usage") else None)

    def _stream(self, words, chat, usage):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        kind = "chat.completion.chunk" if chat else "text_completion"
        for word in words:
            choice = {"index": 0, "delta": {"content": word + " "}} if chat else {"index": 0, "text": word + " "}
            chunk = {"id": "x", "object": kind, "created": 0, "model": "stub-a", "choices": [choice]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        if usage is not None:
            chunk = {"id": "x", "object": kind, "created": 0, "model": "stub-a", "choices": [], "usage": usage}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")


class _StubServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, metrics: bool):
        super().__init__(("127.0.0.1", 0), _Stub)
        self.metrics, self.payloads, self.served, self.lock = metrics, [], 0, threading.Lock()
        self.list_models = True

    def metrics_text(self) -> str:
        # As prometheus_client writes counters: `_total` samples, `_created` timestamps, one per engine.
        lines = []
        for name, per_request in (("drafts", DRAFTS), ("draft_tokens", DRAFT_TOKENS), ("accepted_tokens", ACCEPTED)):
            full = f"vllm:spec_decode_num_{name}"
            lines += [f"# HELP {full} Spec decode counter.", f"# TYPE {full} counter",
                      f'{full}_total{{engine="0",model_name="stub a"}} {1000 + per_request * self.served}.0',
                      f'{full}_total{{engine="1",model_name="stub a"}} 7.0',
                      f'{full}_created{{engine="0",model_name="stub a"}} 1.7e+09']
        return "\n".join(lines) + "\n"


def _serve(metrics: bool = True):
    server = _StubServer(metrics)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


@pytest.fixture
def stub():
    server, url = _serve()
    yield server, url
    server.shutdown()
    server.server_close()


@pytest.fixture
def stub_without_metrics():
    server, url = _serve(metrics=False)
    yield server, url
    server.shutdown()
    server.server_close()


TEXTS = ["one two three", "four five", "six", "seven eight nine ten", "a b"]


def _traffic(tmp_path, texts=TEXTS, prompt_last=True):
    lines = [{"id": f"r{i}", "messages": [{"role": "user", "content": t}]} for i, t in enumerate(texts)]
    if prompt_last:  # a raw prompt goes to text completions
        lines[-1] = {"id": f"r{len(texts) - 1}", "prompt": texts[-1]}
    path = tmp_path / "traffic.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("stream", [False, True])
def test_replay_counts_requests_tokens_and_the_spec_decode_difference(stub, tmp_path, stream):
    server, url = stub
    options = ReplayOptions(url=url, dataset=str(_traffic(tmp_path)), concurrency=3, stream=stream)
    record = run_replay(options, progress=False)
    summary = record["summary"]
    assert summary["requests"] == 5 and summary["errors"] == 0 and summary["error_examples"] == []
    assert summary["output_tokens"] == sum(len(t.split()) for t in TEXTS) == 12
    assert summary["prompt_tokens"] == 500 and summary["requests_without_usage"] == 0
    assert summary["output_tokens_per_s"] == pytest.approx(12 / summary["wall_s"])
    assert 0 < summary["latency_p50_s"] <= summary["latency_p95_s"] <= summary["wall_s"]
    assert (summary["ttft_p50_s"] is not None) == stream
    assert summary["spec_decode"] == dict(drafts=5 * DRAFTS, draft_tokens=5 * DRAFT_TOKENS,
                                          accepted_tokens=5 * ACCEPTED, acceptance_rate=ACCEPTED / DRAFT_TOKENS,
                                          mean_accepted_length=1 + ACCEPTED / DRAFTS)
    assert [r["id"] for r in record["requests"]] == [f"r{i}" for i in range(5)]  # request order, not finish order
    assert [r["completion_tokens"] for r in record["requests"]] == [3, 2, 1, 4, 2]
    assert record["model"] == "stub-a"  # the first model the server lists
    paths = sorted(path for path, _ in server.payloads)
    assert paths == ["/v1/chat/completions"] * 4 + ["/v1/completions"]
    assert "0.625" in record["table"] and "3.50" in record["table"]
    assert ("time to first token" in record["table"]) == stream


def test_replay_sends_the_sampling_options(stub, tmp_path):
    server, url = stub
    options = ReplayOptions(url=url + "/v1/", dataset=str(_traffic(tmp_path)), max_tokens=7, temperature=0.5,
                            seed=11, model="stub-b", limit=2)
    record = run_replay(options, progress=False)
    assert record["summary"]["requests"] == 2 and record["model"] == "stub-b"
    for _, payload in server.payloads:
        assert (payload["max_tokens"], payload["temperature"], payload["seed"], payload["model"]) == (7, 0.5, 11, "stub-b")


def test_failed_requests_are_counted_with_their_messages(stub, tmp_path):
    texts = ["fine one", "BAD first", "fine two", "BAD second", "fine three"]
    _, url = stub
    options = ReplayOptions(url=url, dataset=str(_traffic(tmp_path, texts, prompt_last=False)), concurrency=2)
    record = run_replay(options, out_dir=tmp_path / "out", progress=False)
    summary = record["summary"]
    assert summary["requests"] == 5 and summary["errors"] == 2
    assert summary["output_tokens"] == 6  # the failed requests add nothing
    assert summary["error_examples"] == ["r1: HTTP 400: bad request: BAD first", "r3: HTTP 400: bad request: BAD second"]
    assert summary["spec_decode"]["drafts"] == 3 * DRAFTS  # only the served requests drafted
    assert "first 2 errors:" in record["table"] and "r1: HTTP 400" in record["table"]
    saved = json.loads((tmp_path / "out" / "replay.json").read_text())
    assert [r["ok"] for r in saved["requests"]] == [True, False, True, False, True]
    assert saved["summary"]["errors"] == 2 and "api_key" not in saved["settings"]


def test_a_server_without_metrics_gives_no_acceptance(stub_without_metrics, tmp_path):
    _, url = stub_without_metrics
    record = run_replay(ReplayOptions(url=url, dataset=str(_traffic(tmp_path))), progress=False)
    assert record["summary"]["spec_decode"] is None and record["counters"]["before"] is None
    assert "no vLLM spec-decode counters" in record["table"]


def test_unreachable_url_is_a_clear_error(tmp_path):
    url = f"http://127.0.0.1:{_free_port()}"
    with pytest.raises(ReplayError, match="cannot reach an OpenAI-compatible server at .*is it running"):
        run_replay(ReplayOptions(url=url, dataset=str(_traffic(tmp_path))), progress=False)


def test_cli_unreachable_url_exits_nonzero_without_traceback(capsys, tmp_path):
    code = main(["replay", "--url", f"http://127.0.0.1:{_free_port()}", "--dataset", str(_traffic(tmp_path))])
    err = capsys.readouterr().err
    assert code == 2 and "cannot reach" in err and "Traceback" not in err


def test_unknown_model_lists_the_served_ones(stub, tmp_path):
    _, url = stub
    with pytest.raises(ReplayError, match="does not serve model 'nope'.*stub-a, stub-b"):
        run_replay(ReplayOptions(url=url, dataset=str(_traffic(tmp_path)), model="nope"), progress=False)


def test_a_server_that_lists_no_models_needs_a_model_name(stub, tmp_path):
    server, url = stub
    server.list_models = False  # /v1/models answers 404
    with pytest.raises(ReplayError, match="models answered HTTP 404: is this an OpenAI-compatible server"):
        run_replay(ReplayOptions(url=url, dataset=str(_traffic(tmp_path))), progress=False)
    record = run_replay(ReplayOptions(url=url, dataset=str(_traffic(tmp_path)), model="unlisted"), progress=False)
    assert record["model"] == "unlisted" and record["summary"]["errors"] == 0


def test_malformed_jsonl_line_names_file_and_line(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text('{"prompt": "fine"}\n{"prompt": oops}\n')
    # The traffic is read before the server is contacted: no server is needed to find the mistake.
    with pytest.raises(DatasetError, match=r"mine\.jsonl, line 2: invalid JSON"):
        run_replay(ReplayOptions(url=f"http://127.0.0.1:{_free_port()}", dataset=str(path)), progress=False)
    path.write_text('{"prompt": "fine"}\n{"text": "neither"}\n')
    with pytest.raises(DatasetError, match=r"mine\.jsonl, line 2: a request needs \"messages\""):
        run_replay(ReplayOptions(url="http://127.0.0.1:1", dataset=str(path)), progress=False)


def test_cli_unknown_dataset_and_bad_options(capsys):
    assert main(["replay", "--url", "http://127.0.0.1:1", "--dataset", "no-such-set"]) == 2
    assert "unknown dataset 'no-such-set'" in capsys.readouterr().err
    assert main(["replay", "--url", "localhost:8000", "--dataset", "api-bank"]) == 2
    assert "--url must be an http:// or https:// URL" in capsys.readouterr().err
    assert main(["replay", "--url", "http://x", "--dataset", "api-bank", "--concurrency", "0"]) == 2
    assert "--concurrency must be a positive integer" in capsys.readouterr().err


def test_cli_prints_the_table_and_writes_the_record(capsys, stub, tmp_path):
    _, url = stub
    code = main(["replay", "--url", url, "--dataset", str(_traffic(tmp_path)), "--stream", "--concurrency", "2",
                 "--api-key", "secret", "--out", str(tmp_path / "out"), "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0 and "| requests | 5 |" in out and "| output tokens | 12 |" in out
    assert "time to first token p50 / p95 (s)" in out and "| draft acceptance rate | 0.625 |" in out
    saved = (tmp_path / "out" / "replay.json").read_text()
    assert "secret" not in saved and json.loads(saved)["summary"]["requests"] == 5


def test_missing_openai_says_how_to_install_it(monkeypatch, tmp_path):
    import sys

    monkeypatch.setitem(sys.modules, "openai", None)  # `import openai` now raises ImportError
    with pytest.raises(ReplayError, match="pip install openai"):
        run_replay(ReplayOptions(url="http://127.0.0.1:1", dataset=str(_traffic(tmp_path))), progress=False)


def test_prometheus_parsing_sums_engines_and_skips_created_and_comments():
    text = ('# HELP vllm:spec_decode_num_drafts x\n# TYPE vllm:spec_decode_num_drafts counter\n'
            'vllm:spec_decode_num_drafts_total{engine="0",model_name="a b}"} 4.0\n'
            'vllm:spec_decode_num_drafts_total{engine="1"} 6 1712345678000\n'
            'vllm:spec_decode_num_drafts_created{engine="0"} 1.7e+09\n'
            "vllm:spec_decode_num_draft_tokens 20\n"
            "vllm:spec_decode_num_accepted_tokens_per_pos_total{position=\"0\"} 3\n"
            "vllm:spec_decode_num_accepted_tokens_total NaN\n")
    assert parse_prometheus(text) == {"vllm:spec_decode_num_drafts": 10.0, "vllm:spec_decode_num_draft_tokens": 20.0}
    assert metrics_url("https://host:8000/v1/") == "https://host:8000/metrics"


def test_spec_decode_difference_needs_both_reads_and_guards_zero_drafts():
    names = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens")
    before = dict.fromkeys(names, 5.0)
    assert spec_decode_delta(None, before) is None and spec_decode_delta(before, {}) is None
    assert spec_decode_delta(before, before) == dict(drafts=0, draft_tokens=0, accepted_tokens=0,
                                                     acceptance_rate=None, mean_accepted_length=None)


def test_summary_percentiles_use_successful_requests_only():
    outcomes = [RequestOutcome(f"r{i}", latency_s=float(i), completion_tokens=10) for i in range(1, 11)]
    outcomes.append(RequestOutcome("bad", latency_s=100.0, error="HTTP 500: boom"))
    summary = summarize(outcomes, wall_s=20.0, spec_decode=None)
    assert summary["latency_p50_s"] == pytest.approx(5.5) and summary["latency_p95_s"] == pytest.approx(9.55)
    assert summary["output_tokens_per_s"] == pytest.approx(5.0) and summary["errors"] == 1
    with pytest.raises(ConfigError, match="--limit must be a positive integer"):
        ReplayOptions(url="http://x", dataset="api-bank", limit=0)
