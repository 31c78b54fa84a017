"""Per-tenant counters in Prometheus' text format (oilbird/integrations/vllm/metrics.py)."""

from oilbird.integrations.vllm.metrics import prometheus_text


def test_counters_are_summed_over_workers_and_rates_derived():
    workers = [{"a": {"requests": 2, "forwards": 10, "committed": 30, "drafted": 40, "accepted": 20,
                      "pool_bytes": 100, "requests_in_flight": 2}},
               {"a": {"requests": 1, "forwards": 0, "committed": 0, "drafted": 0, "accepted": 0,
                      "pool_bytes": 5}},
               {'we"ird': {"requests": 1}}]
    text = prometheus_text(workers)
    assert 'oilbird_requests_total{tenant="a"} 3' in text
    assert 'oilbird_draft_tokens_total{tenant="a"} 40' in text
    assert 'oilbird_accepted_tokens_total{tenant="a"} 20' in text
    assert 'oilbird_acceptance_rate{tenant="a"} 0.5' in text
    assert 'oilbird_tau{tenant="a"} 3.0' in text
    assert 'oilbird_pool_bytes{tenant="a"} 105' in text
    assert 'oilbird_requests_in_flight{tenant="a"} 2' in text
    assert 'tenant="we\\"ird"' in text and "# TYPE oilbird_tau gauge" in text
