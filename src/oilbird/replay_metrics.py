"""vLLM's speculative-decoding counters, read from a server's Prometheus `/metrics` page.

`oilbird replay` reads the counters before and after a replay and reports the difference:
    acceptance rate       = accepted tokens / draft tokens
    mean accepted length  = 1 + accepted tokens / drafts   (vLLM's "mean acceptance length"; a
                            draft is one request-step that carried draft tokens)
The counters are server-wide: traffic from other clients during the replay is counted too.
"""

from __future__ import annotations

import math
import urllib.error
import urllib.request
from urllib.parse import urlsplit

__all__ = ["SPEC_COUNTERS", "metrics_url", "parse_prometheus", "read_spec_counters", "spec_decode_delta"]

SPEC_COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens")


def metrics_url(url: str) -> str:
    """The Prometheus page at the root of the server at `url` (any path of `url` is dropped).

    Args:
        url: the server's URL, e.g. `http://host:8000` or `http://host:8000/v1`.

    Returns:
        `<scheme>://<host:port>/metrics`.
    """
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}/metrics"


def parse_prometheus(text: str, names: tuple[str, ...] = SPEC_COUNTERS) -> dict[str, float]:
    """Sum the samples of the named counters in Prometheus' text exposition format.

    prometheus_client exposes a counter `x` as the sample `x_total` (and a `x_created` timestamp,
    which is not a count), so both `x` and `x_total` count as `x`; samples of one counter with
    different labels (several engines, models) are summed.

    Args:
        text: the page's text.
        names: the counters wanted.

    Returns:
        name -> summed value, for the names that appear on the page.
    """
    wanted = {name: name for name in names} | {f"{name}_total": name for name in names}
    found: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        # Label values may hold spaces: the value follows the last '}' when there are labels.
        if "{" in line:
            sample, _, rest = line.partition("{")
            rest = rest.rpartition("}")[2]
        else:
            sample, _, rest = line.partition(" ")
        name = wanted.get(sample.strip())
        fields = rest.split()
        if name is None or not fields:
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue  # a malformed sample: skip it rather than fail the whole replay
        if math.isfinite(value):
            found[name] = found.get(name, 0.0) + value
    return found


def read_spec_counters(url: str, api_key: str | None = None, timeout_s: float = 10.0) -> dict[str, float] | None:
    """Read the speculative-decoding counters of the server at `url`.

    Args:
        url: the server's URL (the page read is `metrics_url(url)`).
        api_key: sent as a bearer token, for servers that guard the page.
        timeout_s: how long to wait for the page.

    Returns:
        The counters found (possibly none: a server without speculative decoding), or None when
        the server exposes no readable metrics page.
    """
    request = urllib.request.Request(metrics_url(url))
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            text = response.read().decode("utf-8", errors="replace")
    except (urllib.error.URLError, OSError, ValueError):
        # A missing page is normal (not every OpenAI-compatible server is vLLM): report "not exposed".
        return None
    return parse_prometheus(text)


def spec_decode_delta(before: dict[str, float] | None, after: dict[str, float] | None) -> dict | None:
    """The replay's share of the counters, and the acceptance numbers made from it.

    Args:
        before: the counters read before the replay (`read_spec_counters`).
        after: the counters read after it.

    Returns:
        {drafts, draft_tokens, accepted_tokens, acceptance_rate, mean_accepted_length} (the two
        ratios None when nothing was drafted), or None when either read lacks any of the counters.
    """
    if before is None or after is None or any(n not in before or n not in after for n in SPEC_COUNTERS):
        return None
    drafts, draft_tokens, accepted = (after[n] - before[n] for n in SPEC_COUNTERS)
    return dict(
        drafts=int(drafts), draft_tokens=int(draft_tokens), accepted_tokens=int(accepted),
        acceptance_rate=accepted / draft_tokens if draft_tokens > 0 else None,
        mean_accepted_length=1 + accepted / drafts if drafts > 0 else None,
    )
