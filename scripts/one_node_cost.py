"""The one-node cost the old curve timed against the call decoding makes (issue 13, item 3).

The cost curve used to time a bare model forward with a 4-D mask and no hidden states; it now
times `TreeVerifier.verify`. This prints both at one node, interleaved, fastest of 30, over a
512-token cache:

    .venv/bin/python scripts/one_node_cost.py --model smollm2-135m --threads 2
"""

import argparse
import time

import torch

from oilbird.cost_curve import probe_tokens
from oilbird.models import load_model
from oilbird.tree import DraftTree
from oilbird.verifier import TreeVerifier


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prefix", type=int, default=512)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(args.model, log=lambda message: None)
    verifier = TreeVerifier(loaded.tree_model(), loaded.stop_ids)
    vocab = loaded.model.config.vocab_size
    state = verifier.prefill(probe_tokens(vocab, args.prefix + 1))
    anchor, prefix, cpu = state.anchor, state.length, torch.device("cpu")
    old, new = [], []
    with torch.inference_mode():
        for _ in range(30):
            tree = DraftTree.root(anchor)
            mask = tree.attention_mask(prefix, torch.float32, cpu)
            start = time.perf_counter()
            loaded.model(input_ids=torch.tensor([tree.tokens]), attention_mask=mask,
                         position_ids=tree.position_ids(prefix, cpu), past_key_values=state.cache, use_cache=True)
            old.append(time.perf_counter() - start)
            state.cache.crop(-1)
            start = time.perf_counter()
            verifier.verify(state, tree)
            new.append(time.perf_counter() - start)
            state.cache.crop(-(state.length - prefix))
            state.length, state.anchor = prefix, anchor
    print(f"{args.model}, {args.threads} threads: old curve's one-node call (4-D mask, no hidden states) "
          f"{1e3 * min(old[1:]):.1f} ms; TreeVerifier.verify at one node {1e3 * min(new[1:]):.1f} ms")


if __name__ == "__main__":
    main()
