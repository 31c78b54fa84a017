"""scripts/vllm_interleave.py's bookkeeping (no vLLM here: its engines are faked; the numbers are
hand-built chunks) and vllm_bench.py's per-method settings."""

import sys
from pathlib import Path

import pytest

from oilbird.errors import ConfigError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import vllm_bench  # noqa: E402
import vllm_interleave as il  # noqa: E402


def chunk(tokens, wall, drafts=0, draft_tokens=0, accepted=0, per_pos=(), n_out=1):
    return dict(output_tokens=tokens, wall_s=wall, num_drafts=drafts, num_draft_tokens=draft_tokens,
                num_accepted_tokens=accepted, accepted_per_pos=list(per_pos),
                loadavg_1m=[0.5, 0.7], prefill_s=1.0, decode_s=2.0,
                outputs=[dict(id=f"r{i}", output_ids=[1, 2]) for i in range(n_out)])


def record(method, chunks):
    return il.pooled(method, {"startup_s": 1.0}, chunks)


def test_pooled_sums_chunks_and_merges_accepted_positions():
    r = record("oilbird", [chunk(64, 2.0, 4, 10, 6, [3, 2, 1]), chunk(32, 2.0, 2, 6, 2, [2])])
    assert r["output_tokens"] == 96 and r["wall_s"] == 4.0
    assert r["tokens_per_s"] == pytest.approx(24.0)
    assert r["accepted_per_pos"] == [5, 2, 1]
    assert r["acceptance"] == pytest.approx(8 / 16)
    assert r["mean_accepted_length"] == pytest.approx(1 + 8 / 6)
    assert r["prefill_s"] == 2.0 and len(r["outputs"]) == 2
    assert all("outputs" not in c for c in r["chunks"])
    assert record("none", [chunk(10, 1.0)])["acceptance"] is None


def test_paired_ratio_is_exact_when_every_chunk_agrees():
    ref = record("suffix", [chunk(60, 3.0), chunk(40, 1.0), chunk(50, 2.0)])
    same = record("a", [chunk(60, 3.0), chunk(40, 1.0), chunk(50, 2.0)])
    twice = record("b", [chunk(60, 1.5), chunk(40, 0.5), chunk(50, 1.0)])
    p = il.paired(same, ref)
    assert (p["pooled"], p["geomean"], p["low"], p["high"]) == pytest.approx((1, 1, 1, 1))
    assert p["chunks_ahead"] == 0 and p["chunks"] == 3
    q = il.paired(twice, ref)
    assert (q["pooled"], q["geomean"], q["low"], q["high"]) == pytest.approx((2, 2, 2, 2))
    assert q["chunks_ahead"] == 3


def test_paired_interval_spans_disagreeing_chunks():
    ref = record("suffix", [chunk(100, 1.0)] * 6)
    mixed = record("a", [chunk(100, w) for w in (0.8, 1.25, 0.8, 1.25, 0.9, 1.1)])
    p = il.paired(mixed, ref)
    assert p["low"] < 1.0 < p["high"]
    assert p["chunks_ahead"] == 3
    assert il.paired(mixed, ref) == p  # seeded: the same interval every time


class FakeEngine:
    def __init__(self, method, log):
        self.method, self.log = method, log

    def run(self, a, b):
        self.log.append((self.method, a, b))
        return dict(chunk(b - a, 1.0), ok=True)


def test_serve_chunks_rotates_the_order_and_covers_every_request():
    log = []
    engines = {m: FakeEngine(m, log) for m in ("none", "suffix", "oilbird")}
    results = il.serve_chunks(engines, n=7, size=3)
    assert [(a, b) for _, a, b in log[::3]] == [(0, 3), (3, 6), (6, 7)]
    firsts = [m for m, _, _ in log[::3]]
    assert firsts == ["none", "suffix", "oilbird"]  # each method leads one chunk
    for m in engines:
        assert [c["first_request"] for c in results[m]] == [0, 3, 6]
        assert sorted(c["position"] for c in results[m]) == [0, 1, 2]


def test_a_failed_chunk_stops_the_run_with_its_reason():
    class Broken(FakeEngine):
        def run(self, a, b):
            return dict(ok=False, error="RuntimeError: boom")

    with pytest.raises(RuntimeError, match="oilbird, requests 0-2: RuntimeError: boom"):
        il.serve_chunks({"none": FakeEngine("none", []), "oilbird": Broken("oilbird", [])}, 2, 2)


def test_parse_args_defaults_and_refusals(capsys):
    ours, args = il.parse_args(["--methods", "none,suffix,oilbird", "--chunk", "5"])
    assert ours.reference == "suffix" and ours.chunk == 5
    assert args.method_list == ["none", "suffix", "oilbird"]
    assert il.parse_args(["--methods", "sam"])[0].reference == "none"
    for bad, reason in ((["--chunk", "0"], "--chunk must be >= 1"),
                        (["--isolation", "process"], "every method is its own process"),
                        (["--methods", "sam", "--reference", "suffix"], "not among the methods")):
        with pytest.raises(SystemExit):
            il.parse_args(bad)
        assert reason in capsys.readouterr().err


def test_tagged_settings_reach_only_their_method():
    args = vllm_bench.parse_args(["--methods", "oilbird,oilbird#r3", "--set", "r3:max_batch_reach=0.3",
                                  "--set", "min_reach=0.2"])
    plain = vllm_bench.oilbird_options("oilbird", args)
    tagged = vllm_bench.oilbird_options("oilbird#r3", args)
    assert plain == {"method": "oilbird", "min_reach": 0.2}
    assert tagged == {"method": "oilbird", "min_reach": 0.2, "max_batch_reach": 0.3}
    kwargs = vllm_bench.engine_kwargs("oilbird#r3", args)
    assert kwargs["additional_config"]["oilbird"]["max_batch_reach"] == 0.3
    bad = vllm_bench.parse_args(["--methods", "oilbird", "--set", "no_such_field=1"])
    with pytest.raises(ConfigError, match="no config field 'no_such_field'"):
        vllm_bench.oilbird_options("oilbird", bad)


def write_run(directory: Path, chunks_by_method: dict, **settings) -> str:
    import json

    base = dict(workload="stream", requests=4, max_num_seqs=8, max_tokens=64, num_spec=8, threads=1,
                dtype="float32", device="cpu")
    rows = [{k: v for k, v in record(m, cs).items() if k != "outputs"} for m, cs in chunks_by_method.items()]
    directory.mkdir()
    (directory / "summary.json").write_text(json.dumps(dict(settings=dict(base, **settings), rows=rows)))
    return str(directory)


def test_combine_pools_every_run_s_chunks(tmp_path, capsys):
    a = write_run(tmp_path / "a", {"suffix": [chunk(10, 1.0), chunk(10, 1.0)], "oilbird": [chunk(11, 1.0), chunk(11, 1.0)]})
    b = write_run(tmp_path / "b", {"suffix": [chunk(10, 1.0)], "oilbird": [chunk(9, 1.0)], "sam": [chunk(1, 1.0)]})
    assert il.main(["--combine", a, b]) == 0
    out = capsys.readouterr().out
    assert "| oilbird | 1.033× |" in out  # (11 + 11 + 9) / (10 + 10 + 10) tokens in equal seconds
    assert "2/3 |" in out and "sam" not in out  # chunks ahead out of all three; sam is not in run a


def test_combine_refuses_runs_with_other_settings_or_no_summary(tmp_path):
    a = write_run(tmp_path / "a", {"suffix": [chunk(10, 1.0)], "oilbird": [chunk(11, 1.0)]})
    b = write_run(tmp_path / "b", {"suffix": [chunk(10, 1.0)], "oilbird": [chunk(11, 1.0)]}, max_num_seqs=1)
    with pytest.raises(SystemExit, match="max_num_seqs"):
        il.main(["--combine", a, b])
    with pytest.raises(SystemExit, match="cannot read"):
        il.main(["--combine", a, str(tmp_path / "missing")])
    with pytest.raises(SystemExit, match="not in every run"):
        il.main(["--combine", a, "--reference", "sam"])
    bench = tmp_path / "bench"
    bench.mkdir()
    (bench / "summary.json").write_text('{"settings": {}, "rows": [{"method": "suffix"}]}')  # vllm_bench.py's
    with pytest.raises(SystemExit, match="holds no chunks"):
        il.main(["--combine", a, str(bench)])


def test_every_workload_loads_its_sample_and_names_its_tenant():
    """The vLLM scripts' workloads (scripts/workloads.py): each names a dataset sample that loads,
    of the size it promises, and the tenant its requests share is that dataset's."""
    from oilbird.datasets import load_dataset
    from workloads import WORKLOADS, tenant_of

    for name, work in WORKLOADS.items():
        requests = load_dataset(work.dataset, per_category=work.per_category, limit=work.limit)
        assert len(requests) == work.limit, name
        assert tenant_of(name) == work.dataset
    spec = load_dataset("spec-bench", per_category=4, limit=52)  # every category, four each
    assert len({r.category for r in spec}) == 13


def test_the_code_that_ran_is_read_once_as_a_run_starts():
    """A commit made while a long run goes on must not be recorded as the code that ran: the
    scripts read `source_state()` as they start and the report reads the same answer."""
    import vllm_records

    assert vllm_records.source_state() is vllm_records.source_state()
    assert vllm_records.build_kernels("cuda") is None  # a CUDA run builds no CPU kernels
