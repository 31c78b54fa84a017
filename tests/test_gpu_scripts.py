"""scripts/gpu_check.sh and scripts/gpu_vllm_check.sh run only where a GPU is lent, so nothing else
would notice their command lines going stale: each command they run must still parse with the
parser it is handed to, and on a host without CUDA each stops at once with its message (exit 2)."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from oilbird.cli import _forward_config, build_parser

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
sys.path.insert(0, str(SCRIPTS))


def _array(script: str, name: str) -> str:
    """The body of the bash array `name=( ... )` (one or more lines) in `script`."""
    found = re.search(rf"^\s*{name}=\((.*?)\)\s*$", script, re.MULTILINE | re.DOTALL)
    assert found, f"no {name}=(...) in the script: update this test with it"
    return found.group(1)


def _words(body: str, values: dict[str, str]) -> list[str]:
    """The array's words with the script's variables given their values."""
    for var, value in values.items():
        body = body.replace(f'"${var}"', value).replace(f"${var}", value)
    return shlex.split(body)


def _assignment(script: str, name: str) -> str:
    found = re.search(rf"^{name}=(\S+)", script, re.MULTILINE)
    assert found, f"no {name}= in the script"
    value = found.group(1)
    return re.sub(r"^\$\{\w+:-(.*)\}$", r"\1", value)  # ${DTYPE:-bfloat16} -> bfloat16


def test_gpu_check_commands_parse_with_oilbirds_cli(tmp_path):
    script = (SCRIPTS / "gpu_check.sh").read_text()
    values = dict(DTYPE=_assignment(script, "DTYPE"), METHODS=_assignment(script, "METHODS"), OUT=str(tmp_path))
    for name in ("COST", "BENCH"):
        words = _words(_array(script, name), values)
        assert words[:3] == ["$PY", "-m", "oilbird.cli"], words
        args = build_parser().parse_args(words[3:])  # a stale flag exits 2 here (SystemExit)
        forward = _forward_config(args)  # what the command loads the model with
        assert forward.device == "cuda" and forward.dtype == "bfloat16"


def test_gpu_vllm_check_command_parses_with_vllm_bench():
    import vllm_bench

    script = (SCRIPTS / "gpu_vllm_check.sh").read_text()
    words = _words(_array(script, "cmd"), dict(METHODS=_assignment(script, "METHODS"), seqs="8", dir="/tmp/x"))
    assert words[1] == "scripts/vllm_bench.py", words
    args = vllm_bench.parse_args(words[2:])
    assert args.device == "cuda" and args.max_num_seqs == 8 and "oilbird" in args.method_list


@pytest.mark.parametrize("script", ["gpu_check.sh", "gpu_vllm_check.sh"])
def test_without_cuda_the_gpu_scripts_stop_with_a_message(tmp_path, script):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this host has CUDA: the scripts would run for minutes")
    proc = subprocess.run(["bash", str(SCRIPTS / script)], capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", str(tmp_path)),
                               "PY": sys.executable, "OUT": str(tmp_path)})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "cannot import" in proc.stderr and "CUDA" in proc.stderr
