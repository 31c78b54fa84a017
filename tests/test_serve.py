"""`oilbird serve`'s command line (oilbird/serve.py) where vLLM is not installed.

The server itself is tested in the vLLM environment (tests/serving/); here: what reaches vLLM's
parser, and that mistakes are reported before vLLM would start.
"""

from __future__ import annotations

import json

import pytest

from oilbird.cli import build_parser, main


def parse(*argv):
    args, rest = build_parser().parse_known_args(["serve", *argv])
    args.rest = rest
    return args


def test_vllm_gets_our_proposer_worker_and_config_and_the_users_options_last():
    from oilbird.serve import drafter_config, vllm_argv

    args = parse("--method", "sam", "--node-budget", "32", "--state-dir", "/s", "--max-num-seqs", "8")
    argv = vllm_argv(args, drafter_config(args), "/models/smol", on_cpu=True)
    opts = dict(zip(argv[::2], argv[1::2]))
    assert opts["--model"] == "/models/smol" and opts["--dtype"] == "float32"
    assert json.loads(opts["--speculative-config"]) == {
        "method": "custom_class", "model": "oilbird.integrations.vllm.OilbirdProposer",
        "num_speculative_tokens": 8}
    assert opts["--worker-cls"] == "oilbird.integrations.vllm.OilbirdCPUWorker"
    extra = json.loads(opts["--additional-config"])["oilbird"]
    assert extra["method"] == "sam" and extra["node_budget"] == 32 and extra["state_dir"] == "/s"
    assert opts["--middleware"] == "oilbird.tenant_keys.TenantMiddleware"
    assert opts["--served-model-name"] == "smollm2-135m" and argv[-2:] == ["--max-num-seqs", "8"]
    gpu = vllm_argv(parse("--dtype", "bfloat16"), drafter_config(args), "/m", on_cpu=False)
    assert "oilbird.integrations.vllm.OilbirdGPUWorker" in gpu and gpu.count("--dtype") == 1
    # SIGTERM drains and lets the workers snapshot, unless the user chose otherwise.
    assert opts["--shutdown-timeout"] == "30"
    own = vllm_argv(parse("--shutdown-timeout=5"), drafter_config(args), "/m", on_cpu=True)
    assert not any(a == "--shutdown-timeout" for a in own) and "--shutdown-timeout=5" in own


@pytest.mark.parametrize("argv, message", [
    (["--method", "nope"], "unknown method"),
    (["--method", "pld+fly"], "strict"),
    (["--num-speculative-tokens", "0"], "num-speculative-tokens"),
    (["--node-budget", "1"], "node_budget"),
])
def test_bad_options_fail_before_vllm_starts(argv, message, capsys):
    assert main(["serve", *argv]) == 2
    assert message in capsys.readouterr().err


def test_a_bad_key_file_fails_before_vllm_starts(tmp_path, capsys):
    (tmp_path / "k.json").write_text("[]")
    assert main(["serve", "--api-keys", str(tmp_path / "k.json")]) == 2
    assert "JSON object" in capsys.readouterr().err


def test_without_vllm_the_error_says_how_to_get_it(capsys):
    import importlib.util

    assert importlib.util.find_spec("vllm") is None  # this file runs in the engine's environment
    assert main(["serve"]) == 2
    assert "make vllm" in capsys.readouterr().err


def test_other_commands_still_reject_unknown_options(capsys):
    with pytest.raises(SystemExit):
        main(["list", "--bogus"])
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err
