"""Per-tenant drafting counters in Prometheus' text format (served at `/oilbird/metrics`)."""

from __future__ import annotations

_HELP = {
    "oilbird_requests_total": ("counter", "Finished requests."),
    "oilbird_forwards_total": ("counter", "Verification steps (the prefill's first token included)."),
    "oilbird_committed_tokens_total": ("counter", "Committed tokens."),
    "oilbird_draft_tokens_total": ("counter", "Draft tokens verified."),
    "oilbird_accepted_tokens_total": ("counter", "Draft tokens accepted."),
    "oilbird_probes_total": ("counter", "Chains proposed as exploration probes, past the tenant's estimates (explore_every)."),
    "oilbird_acceptance_rate": ("gauge", "Accepted / verified draft tokens."),
    "oilbird_tau": ("gauge", "Committed tokens per verification step (accepted length)."),
    "oilbird_pool_bytes": ("gauge", "Bytes the drafter holds for the tenant across requests."),
    "oilbird_requests_in_flight": ("gauge", "Requests the drafter is serving now (started, not yet finished or aborted)."),
}


def prometheus_text(workers: list[dict]) -> str:
    """Prometheus exposition of the workers' `oilbird_stats()` ({tenant: {counter: value}}), summed."""
    tenants: dict[str, dict[str, float]] = {}
    for stats in workers:
        for tenant, counters in stats.items():
            total = tenants.setdefault(tenant, {})
            for name, value in counters.items():
                total[name] = total.get(name, 0) + value
    lines = []
    for metric, (kind, text) in _HELP.items():
        lines += [f"# HELP {metric} {text}", f"# TYPE {metric} {kind}"]
        for tenant, c in sorted(tenants.items()):
            lines.append(f'{metric}{{tenant="{_escape(tenant)}"}} {_value(metric, c)}')
    return "\n".join(lines) + "\n"


def _value(metric: str, c: dict[str, float]) -> float:
    if metric == "oilbird_acceptance_rate":
        return c.get("accepted", 0) / c["drafted"] if c.get("drafted") else 0.0
    if metric == "oilbird_tau":
        return c.get("committed", 0) / c["forwards"] if c.get("forwards") else 0.0
    key = metric.removeprefix("oilbird_").removesuffix("_total").replace("_tokens", "")
    key = {"draft": "drafted", "accepted": "accepted", "pool_bytes": "pool_bytes"}.get(key, key)
    return c.get(key, 0)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
