"""Where a verification forward's time goes, by function, as the tree grows (cProfile).

`TreeVerifier.verify` over a chain of N nodes on a cache of `--prefix` tokens, run `--repeats`
times per N under cProfile; prints the functions with the most own time (ms per verify) at each N.
Our kernels appear as built-in methods (`...linear`, `...tree_attention`); the rest is
transformers' modules and PyTorch's element-wise ops. cProfile adds its own overhead to every
Python call, so read the totals as upper bounds and the kernels' rows as the reliable part.

With `--prefill`, N is a prompt's length and each call prefills it from an empty cache.

Usage:
  .venv/bin/python scripts/verify_profile.py --threads 2
  .venv/bin/python scripts/verify_profile.py --threads 2 --prefill --sizes 100,300,700 --repeats 5
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch

from oilbird.cost_curve import probe_tokens
from oilbird.models import load_model
from oilbird.tree import DraftTree
from oilbird.verifier import TreeVerifier
from forward_cost import row_counts  # scripts/ is on sys.path


def verify_probe(verifier, prefix: int):
    """A probe that verifies a chain of n nodes on a cache of `prefix` tokens, then rolls back."""
    vocab = verifier.model.config.vocab_size
    tokens = probe_tokens(vocab, prefix + 1 + 1024)  # room for any chain profiled
    state = verifier.prefill(tokens[: prefix + 1])
    anchor = state.anchor

    def probe(n: int) -> None:
        verifier.verify(state, DraftTree.chain(anchor, tokens[prefix + 1: prefix + n], "probe"))
        state.cache.crop(-(state.length - prefix))
        state.length, state.anchor = prefix, anchor

    return probe


def prefill_probe(verifier):
    """A probe that prefills a fresh prompt of n tokens (no cached prefix): a request's first cost."""
    vocab = verifier.model.config.vocab_size
    return lambda n: verifier.prefill(probe_tokens(vocab, n + 1))


def profile_sizes(probe, sizes: list[int], repeats: int, what: str) -> dict[int, dict[str, float]]:
    """N -> {function: own ms per call of `probe(N)`}; prints the profiled ms per call."""
    for n in sizes * 3:  # warm-up of every shape
        probe(n)
    result = {}
    for n in sizes:
        profiler = cProfile.Profile()
        start = time.perf_counter()
        profiler.enable()
        for _ in range(repeats):
            probe(n)
        profiler.disable()
        print(f"N={n}: {(time.perf_counter() - start) / repeats * 1e3:.1f} ms per {what} (profiled)")
        stats = pstats.Stats(profiler).stats
        result[n] = {f"{f.split('/')[-1]}:{name}": s[2] / repeats * 1e3 for (f, _, name), s in stats.items()}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--prefix", type=int, default=512)
    parser.add_argument("--sizes", default="1,8,16", type=row_counts)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--prefill", action="store_true",
                        help="profile prefills of N prompt tokens (--sizes) instead of verifies")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(args.model)
    sizes = args.sizes
    verifier = TreeVerifier(loaded.tree_model(), loaded.stop_ids)
    what = "prefill" if args.prefill else "verify"
    with torch.inference_mode():
        probe = prefill_probe(verifier) if args.prefill else verify_probe(verifier, args.prefix)
        own = profile_sizes(probe, sizes, args.repeats, what)
    print(f"\n| function (own ms per {what}) | " + " | ".join(f"N={n}" for n in sizes) + " |")
    print("| --- | " + " | ".join("---:" for _ in sizes) + " |")
    for key in sorted(own[sizes[-1]], key=lambda k: -own[sizes[-1]][k])[:args.top]:
        print(f"| `{key[:70]}` | " + " | ".join(f"{own[n].get(key, 0.0):.2f}" for n in sizes) + " |")


if __name__ == "__main__":
    main()
