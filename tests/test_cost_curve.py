"""The verifier's cost curve (oilbird/cost_curve.py): interpolation, the measurement decoding's own
forward, the cache and its key, the recheck, the probe."""

import json
import pytest

from oilbird.cost_curve import CostCurve


def test_cost_curve_interpolates_and_extrapolates():
    curve = CostCurve({1: 0.06, 8: 0.10, 16: 0.11})
    assert curve.cost(1) == 0.06 and curve.cost(8) == 0.10
    assert abs(curve.cost(12) - 0.105) < 1e-12
    assert curve.cost(24) > curve.cost(16)
    assert CostCurve.from_json(curve.to_json()).points == curve.points


class CallRecorder:
    """The real model, with the options of every forward call written down (not a mock: it runs);
    calls of its decoder alone (the prefill's, the certified head's forwards) are written down too."""

    def __init__(self, model, calls: list | None = None) -> None:
        self.model, self.calls = model, [] if calls is None else calls

    def get_decoder(self):
        return CallRecorder(self.model.get_decoder(), self.calls)

    def __getattr__(self, name):
        return getattr(self.model, name)

    def __call__(self, **kwargs):
        mask = kwargs.get("attention_mask")
        self.calls.append(dict(tokens=kwargs["input_ids"].shape[1], mask=None if mask is None else tuple(mask.shape),
                               hidden=kwargs.get("output_hidden_states")))
        return self.model(**kwargs)


def test_the_cost_curve_times_the_very_forward_decoding_runs(smol):
    """At every size, the measured call has the options of decoding's own (no mask at N = 1,
    no hidden states for drafters that read none), so the curve's N = 1 is the real
    autoregressive step; on the plain model and on the fast kernels alike."""
    from oilbird.cost_curve import measure_cost_curve
    from oilbird.decode import DecodeConfig, decode
    from oilbird.drafters import make_drafter
    from oilbird.verifier import TreeVerifier, VerifierConfig

    for model in (smol.model, smol.tree_model()):
        recorder = CallRecorder(model)
        verifier = TreeVerifier(recorder, smol.stop_ids, VerifierConfig())
        prompt = [1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2]  # repeats: PLD drafts chains, ar drafts none
        for method in ("ar", "pld"):
            decode(verifier, make_drafter(method), prompt, DecodeConfig(max_new_tokens=6, node_budget=4),
                   max_context=smol.max_context)
        decoding = {(c["tokens"], c["mask"], c["hidden"]) for c in recorder.calls[1:] if c["tokens"] <= 4}
        recorder.calls.clear()
        curve = measure_cost_curve(verifier, [1, 4], prefix_len=16, repeats=1)
        measured = {(c["tokens"], c["mask"], c["hidden"]) for c in recorder.calls[1:]}  # [0]: its prefill
        assert curve.points.keys() == {1, 4}
        assert (1, None, False) in decoding and (4, (1, 1, 4, 20), False) in decoding | measured
        assert {m for m in measured if m[0] == 1} == {(1, None, False)}
        assert all(m[2] is False for m in measured | decoding)


def test_the_cost_curve_is_kept_per_verifier_option_and_kernels(smol, tmp_path):
    from oilbird.budget import BudgetConfig
    from oilbird.cost_curve import load_or_measure
    from oilbird.fly import FlyConfig
    from oilbird.verifier import TreeVerifier, VerifierConfig

    config = BudgetConfig(grid="1,2", cost_prefix=16)
    keys = {load_or_measure(smol, TreeVerifier(model, smol.stop_ids, options, fly=fly), config, tmp_path).key
            for model, options, fly in ((smol.tree_model(), VerifierConfig(), None),
                                        (smol.tree_model(), VerifierConfig(top_k=4), None),
                                        (smol.tree_model(), VerifierConfig(), FlyConfig()),
                                        (smol.model, VerifierConfig(), None))}
    assert len(keys) == 4
    assert len(json.loads((tmp_path / "cost-curves.json").read_text())) == 4
    from oilbird.skinny_gemm import skinny_available, source_key

    if skinny_available()[0]:  # keyed by their sources and attention kernel: a change re-measures
        from oilbird.tree_attention import attention_kernel

        tag = f"@{source_key()}:{attention_kernel()}"
        assert sum("kernels=skinny" in key and tag in key for key in keys) == 3


def test_a_measured_dip_is_pooled_away_and_a_monotone_curve_kept():
    from oilbird.cost_curve import monotone

    clean = {1: 1.0, 2: 1.1, 8: 1.5, 16: 2.0}
    assert monotone(clean) == clean
    noisy = monotone({1: 23.0, 2: 21.5, 4: 22.0, 8: 21.2, 12: 31.0, 16: 25.2, 24: 35.4})
    values = [noisy[n] for n in sorted(noisy)]
    assert values == sorted(values)  # never cheaper with more nodes
    assert noisy[1] == noisy[8] == (23.0 + 21.5 + 22.0 + 21.2) / 4  # the dip pooled with its violators
    assert noisy[12] == noisy[16] == (31.0 + 25.2) / 2 and noisy[24] == 35.4


def test_a_curve_moves_when_its_shape_does_not_when_the_host_is_uniformly_slower():
    from oilbird.cost_curve import moved_sizes

    cached = {1: 0.040, 8: 0.049, 16: 0.052, 64: 0.157}  # run f's shape: 1.22, 1.31, 3.93
    assert moved_sizes(cached, {n: 1.3 * t for n, t in cached.items()}, 0.25) == []  # slower, same shape
    stale = {1: 0.051, 8: 0.067, 16: 0.104, 64: 0.205}  # run g's hour: 1.31, 2.04, 4.03
    assert moved_sizes(cached, stale, 0.25) == [16]
    assert moved_sizes(cached, stale, 0.05) == [8, 16]
    assert moved_sizes(cached, {1: 0.04, 16: 0.052}, 0.25) == []  # only the sizes timed are compared


def test_a_curve_timed_in_a_slow_spell_is_stale_a_slower_recheck_keeps_it():
    """Stop 44's cached curve (18.0 ms a step, 26.2 at 8 nodes) passed the shape check against a
    host running the step in 15.0 ms (20.1 at 8): a slow spell had added ~4 ms to every size."""
    from oilbird.budget import BudgetConfig
    from oilbird.cost_curve import stale_reason

    cached = {1: 0.0180, 8: 0.0262, 16: 0.0391, 64: 0.1101}
    now = {1: 0.0150, 8: 0.0201, 16: 0.0301, 64: 0.0859}
    config = BudgetConfig()
    why = stale_reason(cached, now, config)
    assert why is not None and "15.0 ms against its 18.0 ms" in why
    assert stale_reason(cached, {n: 1.3 * t for n, t in cached.items()}, config) is None  # a busier host
    assert stale_reason(cached, {n: 0.95 * t for n, t in cached.items()}, config) is None  # within 10%
    assert stale_reason(cached, now, BudgetConfig(recheck_faster=0.2)) is None
    with pytest.raises(ValueError, match="recheck_faster"):
        BudgetConfig(recheck_faster=1.0)


def test_a_stale_cached_curve_is_measured_again_and_a_kept_one_is_not_rechecked(smol, tmp_path):
    """A cached curve whose shape no longer matches the model's forwards (here: a doctored entry
    claiming 64 nodes cost what one does) is found by the recheck and replaced; with the recheck
    off it is used as stored."""
    from oilbird.budget import BudgetConfig
    from oilbird.cost_curve import host_cpu, load_or_measure
    from oilbird.verifier import TreeVerifier, VerifierConfig

    verifier = TreeVerifier(smol.tree_model(), smol.stop_ids, VerifierConfig())
    config = BudgetConfig(grid="1,8,64", cost_prefix=16)
    key = load_or_measure(smol, verifier, config, tmp_path).key
    assert f"|cpu={host_cpu()}|" in key  # a cache carried to another processor is not reused
    cache = tmp_path / "cost-curves.json"
    flat = {key: {"key": key, "points": {"1": 0.01, "8": 0.01, "64": 0.01}}}
    cache.write_text(json.dumps(flat))
    kept = load_or_measure(smol, verifier, BudgetConfig(grid="1,8,64", cost_prefix=16, recheck=False), tmp_path)
    assert kept.points == {1: 0.01, 8: 0.01, 64: 0.01}
    messages: list[str] = []
    fresh = load_or_measure(smol, verifier, config, tmp_path, log=messages.append)
    assert fresh.points[64] > 1.5 * fresh.points[1]  # a 64-node forward costs more than one token
    assert any("no longer holds" in m and "64 nodes moved" in m for m in messages)
    assert json.loads(cache.read_text())[key]["points"] == {str(n): t for n, t in fresh.points.items()}


def test_a_recheck_times_the_smallest_size_and_where_curves_bend():
    from oilbird.cost_curve import recheck_sizes

    assert recheck_sizes({n: 0.0 for n in (1, 2, 4, 8, 16, 32, 64, 128)}) == [1, 8, 16, 64]
    assert recheck_sizes({1: 0.0, 2: 0.0, 4: 0.0}) == [1, 4]  # none of 8, 16, 64: the largest
    assert recheck_sizes({4: 0.0}) == [4] and recheck_sizes({}) == []


def test_the_probe_is_predicted_like_traffic_not_like_noise(smol):
    """The curve's probe tokens leave the certified LM head few tokens to compute again, as
    traffic does (~48 per row on API-Bank); unrelated tokens, the old probe, leave several times
    more, and the curve charged the head for them."""
    import pytest
    import torch

    from oilbird.cost_curve import PROBE_PERIOD, probe_tokens
    from oilbird.lm_head import CertifiedHead, certified_head_unavailable

    why = certified_head_unavailable(smol.model)
    if why is not None:
        pytest.skip(f"no certified head here: {why}")
    vocab = smol.model.config.vocab_size
    tokens = probe_tokens(vocab, 300)
    assert tokens[:PROBE_PERIOD] == tokens[PROBE_PERIOD: 2 * PROBE_PERIOD] and max(tokens) < vocab
    head = CertifiedHead(smol.model.get_output_embeddings())

    def candidates(ids: list[int]) -> float:
        with torch.inference_mode():
            final = smol.model.get_decoder()(input_ids=torch.tensor([ids])).last_hidden_state[0, -64:]
            return head.topk(final, head.logits(final), 10)[2].float().mean().item()

    probe, noise = candidates(tokens), candidates([(7 * i + 3) % vocab for i in range(300)])
    assert probe < 100 and 2 * probe < noise, (probe, noise)
