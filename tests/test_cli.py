"""The command line: bad input gets a clear message, exit status 2 and no traceback."""

import json
import subprocess
import sys

import pytest

from oilbird.cli import main
from oilbird.skinny_gemm import kernels as compiled_kernels, skinny_available

# what 'auto' picks for SmolLM2: our kernels, reading its GGUF's 4-bit blocks where they build for AVX-512 (prefills on
# the AMX bfloat16 tiles where the CPU has them), norms and MLPs fused
Q4 = skinny_available()[0] and compiled_kernels().q4_available()
BLOCKS = "+q4_1,q8_0<=8192" + ("+prefill:bf16" if compiled_kernels().amx_bf16_available() else "") if Q4 else ""
FAST = f"skinny{BLOCKS}+fused/oilbird_skinny" if skinny_available()[0] else "onednn/oilbird_tree"


def run_cli(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_unknown_dataset_lists_known_ones(capsys):
    code, _, err = run_cli(capsys, "bench", "--dataset", "no-such-set")
    assert code == 2 and "no-such-set" in err and "api-bank/level-1-api" in err
    assert "Traceback" not in err


def test_limit_zero_is_refused(capsys):
    code, _, err = run_cli(capsys, "bench", "--limit", "0")
    assert code == 2 and "--limit must be a positive integer" in err


def test_unknown_method_lists_methods(capsys):
    code, _, err = run_cli(capsys, "bench", "--methods", "ar,nope")
    assert code == 2 and "'nope'" in err and "pld" in err


@pytest.mark.parametrize("spec", ["pld@0", "pld@big", "hf-pld@60"])
def test_bad_method_budget_is_refused(capsys, spec):
    code, _, err = run_cli(capsys, "bench", "--methods", spec)
    assert code == 2 and "name@N, name@auto or name@fit" in err


def test_malformed_jsonl_names_file_and_line(capsys, tmp_path, smol):
    traffic = tmp_path / "traffic.jsonl"
    traffic.write_text(json.dumps({"prompt": "hello"}) + "\n{not json\n")
    code, _, err = run_cli(capsys, "bench", "--dataset", str(traffic), "--limit", "2")
    assert code == 2 and "traffic.jsonl" in err and "line 2" in err


def test_unknown_model_lists_presets(capsys):
    code, _, err = run_cli(capsys, "generate", "--prompt", "hi", "--model", "no-such-model")
    assert code == 2 and "smollm2-135m" in err and "qwen2.5-coder-0.5b" in err


def test_empty_prompt_is_refused(capsys, smol):
    code, _, err = run_cli(capsys, "generate", "--prompt", "   ")
    assert code == 2 and "empty" in err


def test_overlong_prompt_names_both_lengths(capsys, smol):
    long_text = "word " * (smol.max_context + 100)
    code, _, err = run_cli(capsys, "generate", "--raw", "--prompt", long_text)
    assert code == 2 and f"context is {smol.max_context} tokens" in err
    assert "the prompt is" in err


def test_generate_prints_text_and_stats(capsys, smol):
    code, out, err = run_cli(capsys, "generate", "--prompt", "Repeat: red green blue, red green blue,",
                             "--method", "pld", "--max-new-tokens", "12", "--json")
    assert code == 0 and out.strip()
    stats = json.loads(err.strip().splitlines()[-1])
    assert stats["method"] == "pld" and stats["new_tokens"] == 12 and stats["tau"] >= 1.0


def test_cost_measures_and_caches_the_forward_cost_curve(capsys, smol):
    code, out, _ = run_cli(capsys, "cost", "--budget-grid", "1,8", "--budget-cost-prefix", "64")
    assert code == 0
    rows = [line for line in out.splitlines() if line.startswith("| 1 |") or line.startswith("| 8 |")]
    assert len(rows) == 2 and rows[0].endswith("| 1.00 |")
    ms = {int(r.split("|")[1]): float(r.split("|")[2]) for r in rows}
    assert ms[1] > 0 and ms[8] > 0
    # Without the recheck the second call must read the cached curve as it is. (With it, a busy
    # host, such as the other pytest worker, may move the shape past the tolerance and rightly
    # trigger a new measurement; tests/test_cost_curve.py covers that decision.)
    code, again, _ = run_cli(capsys, "cost", "--budget-grid", "1,8", "--budget-cost-prefix", "64",
                             "--budget-recheck", "false")
    assert again == out


@pytest.mark.heavy(35)
def test_bench_prints_its_cost_curve_and_records_its_kernels(capsys, smol, tmp_path):
    for kernels in (["--gemm", "default", "--attention", "sdpa"], []):
        out_dir = tmp_path / ("plain" if kernels else "fast")
        code, out, _ = run_cli(capsys, "bench", "--dataset", "api-bank/level-1-api", "--limit", "1",
                               "--max-new-tokens", "8", "--methods", "pld", "--budget", "auto,fit",
                               "--budget-grid", "1,4", "--budget-cost-prefix", "64", "--warmup", "0",
                               "--no-progress", "--out", str(out_dir), *kernels)
        assert code == 0
        assert "The cost curve the measured budgets ('auto', 'fit') used" in out and "| 4 |" in out
        assert "| pld@auto |" in out and "| pld@fit |" in out
        summary = json.loads((out_dir / "summary.json").read_text())
        expected = "default/sdpa" if kernels else FAST
        assert summary["environment"]["kernels"] == expected
        # the curve prices steps and trees only: its key leaves out the prefill kernel
        assert f"kernels={expected.replace('+prefill:bf16', '')}" in summary["budget_curve"]["key"]
        assert summary["audit_failed"] == []
        # the 'fit' row keeps its estimates' honesty per node shape (scripts/shape_calibration.py)
        assert set(summary["fit_calibration"]) == {"pld@fit"}
        assert isinstance(summary["fit_calibration"]["pld@fit"]["by_shape"], dict)


def test_cost_has_no_mode_option(capsys):
    with pytest.raises(SystemExit):
        main(["cost", "--budget-mode", "fixed"])


@pytest.mark.parametrize("command", ["bench", "generate", "diagnose", "cost", "report", "table", "list",
                                     "serve", "replay"])
def test_every_command_prints_its_help(capsys, command):
    # Option help comes from config docstrings; a literal "%" in one once crashed argparse here.
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0 and "usage: oilbird" in capsys.readouterr().out


def test_console_script_exits_nonzero_without_traceback():
    proc = subprocess.run([sys.executable, "-m", "oilbird.cli", "bench", "--limit", "-3"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "--limit" in proc.stderr


def test_diagnose_refuses_a_bad_dataset_before_loading_a_model(capsys, monkeypatch):
    import oilbird.models

    monkeypatch.setattr(oilbird.models, "load_model", lambda *a, **k: pytest.fail("loaded a model"))
    code, _, err = run_cli(capsys, "diagnose", "--dataset", "no-such-set")
    assert code == 2 and "no-such-set" in err and "humaneval" in err and "Traceback" not in err
    code, _, err = run_cli(capsys, "diagnose", "--limit", "0")
    assert code == 2 and "--limit must be a positive integer" in err
    code, _, err = run_cli(capsys, "diagnose", "--max-new-tokens", "0")
    assert code == 2 and "--max-new-tokens must be a positive integer" in err


def test_diagnose_prints_the_table_and_writes_its_files(capsys, tmp_path, smol, monkeypatch):
    import oilbird.gap_replay

    monkeypatch.setattr(oilbird.gap_replay, "default_cache_dir", lambda: tmp_path / "cache")
    code, out, _ = run_cli(capsys, "diagnose", "--dataset", "api-bank/level-2-api", "--limit", "2",
                           "--max-new-tokens", "6", "--diagnosis-within-request", "true", "--no-progress",
                           "--out", str(tmp_path / "out"), "--plot", str(tmp_path / "d.png"))
    assert code == 0 and "| level-2-api | 12 |" in out and "earlier in the same request" in out
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["config"]["within_request"] is True and summary["requests"] == 2
    assert (tmp_path / "d.png").exists()


def test_diagnose_refuses_a_comparison_run_over_other_requests(capsys, tmp_path, monkeypatch):
    import oilbird.models

    monkeypatch.setattr(oilbird.models, "load_model", lambda *a, **k: pytest.fail("loaded a model"))
    run = tmp_path / "run"
    run.mkdir()
    (run / "records.jsonl").write_text(json.dumps(dict(method="oilbird", request_id="level-1-api/0", new_tokens=4,
                                                       forwards=2, wall_s=1.0)) + "\n")
    code, _, err = run_cli(capsys, "diagnose", "--dataset", "api-bank/level-1-api", "--limit", "2",
                           "--compare-run", str(run))
    assert code == 2 and "not the same" in err and "--per-category" in err


def test_generate_with_fly_reports_a_lossy_result(capsys, smol):
    code, out, err = run_cli(capsys, "generate", "--prompt", "Count: one two three four", "--method", "draft",
                             "--draft-model", "self:4", "--draft-k", "4", "--max-new-tokens", "10", "--json",
                             "--fly", "--fly-theta", "0", "--fly-window", "0")
    assert code == 0 and out.strip()
    stats = json.loads(err.strip().splitlines()[-1])
    assert stats["lossy"] is True and stats["forgiven"] >= 0 and stats["tau"] >= 4.0


def test_fly_options_without_fly_are_refused(capsys):
    code, _, err = run_cli(capsys, "generate", "--prompt", "hi", "--fly-window", "4")
    assert code == 2 and "add --fly" in err


def test_sigterm_stops_a_bench_run_like_ctrl_c(smol, tmp_path):
    import signal
    import time

    out = tmp_path / "run"
    # A background job of a shell script ignores SIGINT: SIGTERM (`timeout`, `kill`) must stop it cleanly.
    proc = subprocess.Popen([sys.executable, "-m", "oilbird.cli", "bench", "--dataset", "api-bank/level-1-api",
                             "--limit", "50", "--max-new-tokens", "8", "--methods", "pld", "--warmup", "0",
                             "--threads", "1", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    records = out / "records.jsonl"
    deadline = time.monotonic() + 300
    while not (records.exists() and records.read_text().count("\n") >= 3) and time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] and 1 <= summary["requests_served"] < 50, stderr
    assert "interrupted: summarized" in stdout and "| pld |" in stdout


@pytest.mark.heavy(35)
def test_bench_exits_3_after_writing_its_outputs_when_a_strict_method_diverges(capsys, smol, tmp_path, monkeypatch):
    import oilbird.bench as bench

    args = ["bench", "--dataset", "api-bank/level-1-api", "--max-new-tokens", "6", "--methods", "pld",
            "--warmup", "0", "--no-progress"]
    code, out, err = run_cli(capsys, *args, "--limit", "1", "--out", str(tmp_path / "good"))
    assert code == 0 and "audit failed" not in err and "FAILED 0" not in out and "AUDIT FAILED" not in out

    real = bench.greedy_reference

    def disagreeing_reference(model, ids, max_new_tokens, stop_ids):
        ref = real(model, ids, max_new_tokens, stop_ids)
        ref.output_ids[2] += 1  # a reference the (correct) outputs cannot match at token 2
        return ref

    monkeypatch.setattr(bench, "greedy_reference", disagreeing_reference)
    run = tmp_path / "bad"
    code, out, err = run_cli(capsys, *args, "--limit", "2", "--out", str(run))
    assert code == 3
    assert [line for line in err.splitlines() if "audit failed" in line] == [
        f"oilbird: audit failed: 4 request(s) of ar, pld differ from greedy decoding "
        f"(see the DIVERGENCE lines; records in {run})"]
    assert "| pld | 2 |" in out and "FAILED 0/2" in out and "DIVERGENCE pld level-1-api/0: token 2" in out
    summary = json.loads((run / "summary.json").read_text())
    assert summary["audit_failed"] == ["ar", "pld"] and summary["requests_served"] == 2
    assert (run / "records.jsonl").read_text().count("\n") == 2 * 3
    code, out, _ = run_cli(capsys, "report", str(run))  # the saved run says so too
    assert code == 0 and "AUDIT FAILED: pld: 2 of 2 requests" in out
    code, out, _ = run_cli(capsys, "table", str(run))
    assert code == 0 and "| pld |" in out and "FAILED 0/2" in out and "AUDIT FAILED: pld" in out
