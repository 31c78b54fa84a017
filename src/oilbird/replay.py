"""`oilbird replay`: replay a dataset against an OpenAI-compatible server and measure it.

Contract:
- The traffic is any dataset `oilbird bench` accepts (`load_dataset`: api-bank[/<file>],
  spec-bench[:<category>,...], humaneval) or the user's own `.jsonl` file; requests are sent in
  file order through a bounded pool of `concurrency` threads with the official `openai` client.
- Requests with "messages" go to chat completions (with their "tools", if any). Requests with a
  raw "prompt" go to text completions: `oilbird bench` serves a prompt as is, without a chat
  template, and wrapping it in one would replay different traffic.
- Each request is sent once (the client's retries are off): a failure is counted as an error with
  its message, never retried into a slower success.
- Latency is per request (send to last byte); time to first token (with `stream`) is send to the
  first chunk carrying output. Output tokens/s = the sum of the servers' completion token counts
  (`usage`) / the replay's wall time.
- When the server exposes vLLM's spec-decode counters at `<URL root>/metrics`, the replay reports
  their difference over the run (see `oilbird.replay_metrics`).
- Bad input raises an `OilbirdError` before any request is sent: an unknown dataset or malformed
  traffic file (`DatasetError`, with file and line), a bad option (`ConfigError`), a server that
  cannot be reached, refuses the key or does not serve the model (`ReplayError`).
"""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlsplit

from tqdm import tqdm

from oilbird.datasets import Request, load_dataset
from oilbird.errors import ConfigError, OilbirdError
from oilbird.replay_metrics import metrics_url, read_spec_counters, spec_decode_delta

__all__ = ["ReplayError", "ReplayOptions", "RequestOutcome", "format_summary", "run_replay", "summarize"]

OPENAI_MISSING = "`oilbird replay` needs the openai client: pip install openai"
ERROR_EXAMPLES = 3  # the first few error messages the summary keeps
PROBE_TIMEOUT_S = 10.0  # reaching the server at all should be quick; requests get `timeout_s`


class ReplayError(OilbirdError):
    """The server cannot be reached, refuses the key, or does not serve the model."""


@dataclass
class ReplayOptions:
    """What to replay, against which server, and how."""

    url: str
    dataset: str
    concurrency: int = 1
    api_key: str | None = None  # never written to the --out record
    limit: int | None = None
    max_tokens: int = 64
    model: str | None = None  # None: the first model the server lists
    temperature: float = 0.0
    seed: int | None = None
    stream: bool = False
    data_dir: str | None = None
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(f"--url must be an http:// or https:// URL, got {self.url!r}")
        for name in ("concurrency", "max_tokens") + (("limit",) if self.limit is not None else ()):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")
        if self.temperature < 0:
            raise ConfigError(f"--temperature must be >= 0, got {self.temperature}")

    @property
    def base_url(self) -> str:
        """The OpenAI API root: `url` itself when it ends in /v1, else `url` + /v1."""
        url = self.url.rstrip("/")
        return url if url.endswith("/v1") else url + "/v1"


@dataclass
class RequestOutcome:
    """One request's measurements (times in seconds)."""

    id: str
    latency_s: float
    ttft_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None  # None: the server sent no usage
    error: str | None = None

    @property
    def ok(self) -> bool:
        """Whether the request succeeded."""
        return self.error is None


@dataclass
class _Usage:
    """What one call brought back (filled in as a stream arrives)."""

    ttft_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


def _import_openai():
    try:
        import openai
    except ImportError:
        raise ReplayError(OPENAI_MISSING) from None
    return openai


def _client(options: ReplayOptions):
    openai = _import_openai()
    # vLLM without --api-key accepts any key; the client insists on one.
    return openai.OpenAI(base_url=options.base_url, api_key=options.api_key or "EMPTY",
                         max_retries=0, timeout=options.timeout_s)


def _served_model(client, options: ReplayOptions) -> str:
    """Probe the server (GET /v1/models) and pick the model.

    Returns:
        `options.model`, or the first model the server lists when it is None.

    Raises:
        ReplayError: the server cannot be reached, refuses the key, lists no model when one must
            be picked, or does not list `options.model`.
    """
    import openai

    where = options.base_url
    try:
        listed = [m.id for m in client.with_options(timeout=PROBE_TIMEOUT_S).models.list()]
    except openai.APIConnectionError as error:
        cause = error.__cause__ or error
        raise ReplayError(f"cannot reach an OpenAI-compatible server at {where} ({cause}); "
                          "is it running, and are the host and port right?") from None
    except openai.AuthenticationError:
        raise ReplayError(f"the server at {where} refused the API key (HTTP 401); pass --api-key") from None
    except openai.APIStatusError as error:
        if options.model is None:
            raise ReplayError(f"GET {where}/models answered HTTP {error.status_code}: is this an OpenAI-compatible "
                              "server? (if it serves a model without listing it, pass --model)") from None
        return options.model  # some servers list no models yet serve the one named
    if options.model is None:
        if not listed:
            raise ReplayError(f"the server at {where} lists no models; pass --model")
        return listed[0]
    if options.model not in listed:
        raise ReplayError(f"the server at {where} does not serve model {options.model!r}; "
                          f"it serves: {', '.join(listed)}")
    return options.model


def _call_kwargs(request: Request, options: ReplayOptions, model: str) -> dict:
    kwargs = dict(model=model, max_tokens=options.max_tokens, temperature=options.temperature)
    if options.seed is not None:
        kwargs["seed"] = options.seed
    if request.prompt is not None:
        kwargs["prompt"] = request.prompt
    else:
        kwargs["messages"] = [dict(m) for m in request.messages]
        if request.tools:
            kwargs["tools"] = [dict(t) for t in request.tools]
    if options.stream:
        # Without this the server sends no token counts in a stream.
        kwargs.update(stream=True, stream_options={"include_usage": True})
    return kwargs


def _has_output(chunk) -> bool:
    if not chunk.choices:
        return False
    choice = chunk.choices[0]
    delta = getattr(choice, "delta", None)
    if delta is None:  # a text completion chunk
        return bool(getattr(choice, "text", None))
    return bool(delta.content or getattr(delta, "tool_calls", None) or getattr(delta, "reasoning_content", None))


def _call(client, request: Request, options: ReplayOptions, model: str, start: float) -> _Usage:
    kwargs = _call_kwargs(request, options, model)
    endpoint = client.completions if request.prompt is not None else client.chat.completions
    response = endpoint.create(**kwargs)
    got = _Usage()
    usage = None
    if options.stream:
        with response:  # closes the connection even when the stream fails halfway
            for chunk in response:
                if got.ttft_s is None and _has_output(chunk):
                    got.ttft_s = time.perf_counter() - start
                usage = chunk.usage or usage  # the last chunk carries the usage of the whole answer
    else:
        usage = response.usage
    if usage is not None:
        got.prompt_tokens, got.completion_tokens = usage.prompt_tokens, usage.completion_tokens
    return got


def _status_message(error) -> str:
    # The server's own message (OpenAI's {"error": {"message"}} or FastAPI's {"detail"}), without
    # the client's "Error code: 400 - " prefix; the raw body when it has neither.
    body = error.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        message = inner.get("message") if isinstance(inner, dict) else inner
        return str(message or body.get("detail") or body)
    return str(body) if body else error.message


def _send(client, request: Request, options: ReplayOptions, model: str) -> RequestOutcome:
    """Send one request and measure it; a failure becomes the outcome's error, not an exception."""
    import openai

    start = time.perf_counter()
    try:
        got = _call(client, request, options, model, start)
    except openai.APIStatusError as error:
        message = f"HTTP {error.status_code}: {_status_message(error)}"
    except openai.OpenAIError as error:
        message = f"{type(error).__name__}: {error.__cause__ or error}"
    else:
        return RequestOutcome(request.id, time.perf_counter() - start, got.ttft_s, got.prompt_tokens,
                              got.completion_tokens)
    return RequestOutcome(request.id, time.perf_counter() - start, error=" ".join(message.split())[:300])


def _replay_all(client, requests: list[Request], options: ReplayOptions, model: str,
                progress: bool) -> tuple[list[RequestOutcome], float]:
    """Send every request through a pool of `options.concurrency` threads.

    Returns:
        The outcomes in request order, and the wall time of the whole replay in seconds.
    """
    outcomes: list[RequestOutcome | None] = [None] * len(requests)
    pool = ThreadPoolExecutor(max_workers=options.concurrency, thread_name_prefix="replay")
    bar = tqdm(total=len(requests), desc=f"replay {options.dataset}", unit="req", file=sys.stderr,
               disable=not progress)
    start = time.perf_counter()
    try:
        futures = {pool.submit(_send, client, r, options, model): i for i, r in enumerate(requests)}
        for future in as_completed(futures):
            outcomes[futures[future]] = future.result()
            bar.update(1)
    except BaseException:
        # Ctrl-C: drop the queued requests and cut the ones in flight instead of waiting for them.
        pool.shutdown(wait=False, cancel_futures=True)
        client.close()
        raise
    finally:
        bar.close()
    wall = time.perf_counter() - start
    pool.shutdown()
    return outcomes, wall


def _percentile(values: list[float], q: float) -> float | None:
    # Linear interpolation between the closest ranks (numpy's default), without numpy.
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(outcomes: list[RequestOutcome], wall_s: float, spec_decode: dict | None) -> dict:
    """The replay's numbers.

    Args:
        outcomes: every request's outcome.
        wall_s: the replay's wall time in seconds.
        spec_decode: `spec_decode_delta`'s result (None: the server exposes no counters).

    Returns:
        requests, errors, error_examples ("<id>: <message>", the first few), latency and time to
        first token p50/p95 (seconds, over successful requests; None without data), prompt and
        output token sums, requests_without_usage, wall_s, output_tokens_per_s and spec_decode.
    """
    ok = [o for o in outcomes if o.ok]
    latencies = [o.latency_s for o in ok]
    ttfts = [o.ttft_s for o in ok if o.ttft_s is not None]
    output_tokens = sum(o.completion_tokens or 0 for o in ok)
    return dict(
        requests=len(outcomes),
        errors=len(outcomes) - len(ok),
        error_examples=[f"{o.id}: {o.error}" for o in outcomes if not o.ok][:ERROR_EXAMPLES],
        latency_p50_s=_percentile(latencies, 0.50), latency_p95_s=_percentile(latencies, 0.95),
        ttft_p50_s=_percentile(ttfts, 0.50), ttft_p95_s=_percentile(ttfts, 0.95),
        prompt_tokens=sum(o.prompt_tokens or 0 for o in ok),
        output_tokens=output_tokens,
        requests_without_usage=sum(o.completion_tokens is None for o in ok),
        wall_s=wall_s,
        output_tokens_per_s=output_tokens / wall_s if wall_s > 0 else None,
        spec_decode=spec_decode,
    )


def _number(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def format_summary(summary: dict, stream: bool) -> str:
    """The summary as a readable table, followed by the first few error messages.

    Args:
        summary: `summarize`'s result.
        stream: whether the replay streamed (time to first token is measured only then).

    Returns:
        The table as Markdown text.
    """
    rows = [("requests", str(summary["requests"])), ("errors", str(summary["errors"])),
            ("latency p50 / p95 (s)", f"{_number(summary['latency_p50_s'])} / {_number(summary['latency_p95_s'])}")]
    if stream:
        rows.append(("time to first token p50 / p95 (s)",
                     f"{_number(summary['ttft_p50_s'])} / {_number(summary['ttft_p95_s'])}"))
    missing = summary["requests_without_usage"]
    tokens = str(summary["output_tokens"]) + (f" ({missing} answers without usage)" if missing else "")
    rows += [("output tokens", tokens),
             ("wall time (s)", _number(summary["wall_s"], 2)),
             ("output tokens/s (overall)", _number(summary["output_tokens_per_s"], 1))]
    spec = summary["spec_decode"]
    if spec is None:
        rows.append(("speculative decoding", "no vLLM spec-decode counters at /metrics"))
    else:
        counts = f"{spec['drafts']} / {spec['draft_tokens']} / {spec['accepted_tokens']}"
        rows += [("drafts / draft tokens / accepted", counts),
                 ("draft acceptance rate", _number(spec["acceptance_rate"])),
                 ("mean accepted length", _number(spec["mean_accepted_length"], 2))]
    lines = ["| measure | value |", "| --- | ---: |"] + [f"| {name} | {value} |" for name, value in rows]
    if summary["error_examples"]:
        lines += ["", f"first {len(summary['error_examples'])} errors:"]
        lines += [f"  {example}" for example in summary["error_examples"]]
    return "\n".join(lines)


def run_replay(options: ReplayOptions, *, out_dir: Path | None = None, progress: bool = True) -> dict:
    """Replay a dataset against an OpenAI-compatible server.

    Args:
        options: the server, the traffic and how to send it.
        out_dir: when given, write the record to `<out_dir>/replay.json`.
        progress: show a progress bar on stderr.

    Returns:
        The record: settings (without the API key), model, url, metrics_url, per-request outcomes,
        the counters read before and after, summary (`summarize`) and table (`format_summary`).

    Raises:
        DatasetError: unknown dataset, missing or malformed traffic file (file and line).
        ReplayError: openai not installed, or the server is unreachable, refuses the key, or does
            not serve the model; raised before any request is sent.
    """
    requests = load_dataset(options.dataset, limit=options.limit,
                            data_dir=Path(options.data_dir) if options.data_dir else None)
    client = _client(options)
    model = _served_model(client, options)
    before = read_spec_counters(options.url, options.api_key)
    outcomes, wall = _replay_all(client, requests, options, model, progress)
    after = read_spec_counters(options.url, options.api_key)
    summary = summarize(outcomes, wall, spec_decode_delta(before, after))
    settings = {k: v for k, v in asdict(options).items() if k != "api_key"}
    record = dict(settings=settings, model=model, url=options.base_url, metrics_url=metrics_url(options.url),
                  requests=[asdict(o) | {"ok": o.ok} for o in outcomes],
                  counters=dict(before=before, after=after), summary=summary)
    if out_dir is not None:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "replay.json").write_text(json.dumps(record, indent=1))
    return record | {"table": format_summary(summary, options.stream)}
