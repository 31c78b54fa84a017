"""The certified LM head on real traffic: do its top-k and argmax equal float32's, how many tokens
per row must it compute again, and what does the head cost against the float32 one.

Decodes the first `--requests` API-Bank requests greedily with transformers (the audit's
reference), runs one forward over each prompt + output, and takes the final hidden state at the
last `--positions` positions of each (decoding's own rows). For those rows it reports:
- how often the bfloat16-weight logits' own argmax and top-k differ from float32's (what an
  uncertified bfloat16 head would get wrong), and how often the certified ones do (must be never,
  up to float32 near-ties, which summation order decides);
- the number of candidate tokens the bound leaves per row (all computed again in float32), and
  the mean on the last 64 rows of the cost curve's probe and of unrelated tokens;
- ms of the head at 1, 8, 16 and 64 rows: our float32 kernel, the certified head's bfloat16
  logits + certification, fastest of `--repeats`;
- whole verification forwards (`TreeVerifier.verify` on a 512-token cache, chains of 1, 8, 16
  and 64 nodes) with head='model' and head='certified', alternating for `--rounds` rounds on one
  model copy, fastest per size: what the head saves a forward, and t(n)/t(1) under each head.
docs/RESULTS.md, issue 15, records its output.

With `--forwards-only`, only the whole-forward A/B (head='model' is the GGUF's own blocks where
the verifier reads them, `oilbird.gguf_weights.q4_layers`; `--prefix` sets the cache).

Usage:
  .venv/bin/python scripts/certified_head.py --threads 2
  .venv/bin/python scripts/certified_head.py --threads 2 --model qwen2.5-coder-0.5b
  .venv/bin/python scripts/certified_head.py --threads 2 --forwards-only --rounds 7 --prefix 2048
"""

from __future__ import annotations

import argparse

import torch
from attention_cost import fastest_ms  # scripts/ is on the path when run as a script

from oilbird.cost_curve import probe_times, probe_tokens
from oilbird.datasets import load_dataset
from oilbird.lm_head import CertifiedHead, top_k_and_argmax
from oilbird.models import DEFAULT_MODEL, load_model
from oilbird.skinny_gemm import SkinnyLinear
from oilbird.verifier import TreeVerifier, VerifierConfig


FORWARD_SIZES = [1, 8, 16, 64]
"""Tree sizes (nodes) of the whole-forward A/B: the issue's cost-curve points."""


def final_hidden_rows(loaded, requests: int, positions: int, new_tokens: int) -> torch.Tensor:
    """[rows, hidden] final hidden states at the last `positions` positions of greedy decodes."""
    rows = []
    with torch.inference_mode():
        for request in load_dataset("api-bank", limit=requests):
            ids = torch.tensor([loaded.encode_chat(list(request.messages), tools=request.tools)])
            out = loaded.model.generate(ids, max_new_tokens=new_tokens, do_sample=False)
            forward = loaded.model(out, output_hidden_states=True)
            rows.append(forward.hidden_states[-1][0, -positions:])  # [positions, hidden]
    return torch.cat(rows)


def probe_candidates(loaded, certified: CertifiedHead, top_k: int) -> str:
    """Mean tokens computed again per row on the cost curve's probe rows and on unrelated tokens."""
    vocab, means = loaded.model.config.vocab_size, []
    for ids in (probe_tokens(vocab, 512 + 64), [(7 * i + 3) % vocab for i in range(512 + 64)]):
        with torch.inference_mode():
            final = loaded.model.get_decoder()(input_ids=torch.tensor([ids])).last_hidden_state[0, -64:]
            means.append(certified.topk(final, certified.logits(final), top_k)[2].float().mean().item())
    return f"{means[0]:.1f} on the cost curve's probe rows (cost_curve.probe_tokens), {means[1]:.1f} on unrelated tokens"


def whole_forward_ab(loaded, rounds: int, prefix: int = 512) -> None:
    """Prints ms per verification forward under each head, alternating heads round by round."""
    model = loaded.tree_model()
    heads = {head: TreeVerifier(model, loaded.stop_ids, VerifierConfig(head=head))
             for head in ("model", "certified")}
    best = {head: {} for head in heads}
    for round_ in range(rounds):
        for head in (("model", "certified") if round_ % 2 == 0 else ("certified", "model")):
            for n, seconds in probe_times(heads[head], FORWARD_SIZES, prefix_len=prefix, repeats=1).items():
                best[head][n] = min(best[head].get(n, float("inf")), seconds)
    print(f"\nWhole verification forwards, ms ({prefix}-token cache, fastest of {rounds} alternating rounds; "
          f"the model's head: {type(model.get_output_embeddings()).__name__})\n")
    print("| nodes | head='model' | head='certified' | ratio | t(n)/t(1) model | t(n)/t(1) certified |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for n in FORWARD_SIZES:
        plain, ours = best["model"][n], best["certified"][n]
        print(f"| {n} | {plain * 1e3:.2f} | {ours * 1e3:.2f} | {ours / plain:.3f} | "
              f"{plain / best['model'][1]:.2f} | {ours / best['certified'][1]:.2f} |")


def head_arguments(description: str, threads: int) -> argparse.ArgumentParser:
    """The options a head measurement on real traffic takes (this script's and scripts/int8_head.py's)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--positions", type=int, default=64, help="rows per request (its last positions)")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=threads)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--top-k", type=int, default=10, help="the verifier's top-k (VerifierConfig.top_k)")
    return parser


def main() -> None:
    parser = head_arguments(__doc__.split("\n\n")[0], threads=2)
    parser.add_argument("--rounds", type=int, default=10, help="alternating rounds of the whole-forward A/B")
    parser.add_argument("--prefix", type=int, default=512, help="the whole-forward A/B's cache length")
    parser.add_argument("--forwards-only", action="store_true", help="only the whole-forward A/B")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(args.model)
    if args.forwards_only:
        return whole_forward_ab(loaded, args.rounds, args.prefix)
    hidden = final_hidden_rows(loaded, args.requests, args.positions, args.new_tokens)  # [rows, d]
    head_weight = loaded.model.get_output_embeddings().weight
    certified = CertifiedHead(loaded.model.get_output_embeddings())
    with torch.inference_mode():
        exact = (hidden @ head_weight.T).topk(args.top_k, dim=-1).indices  # [rows, k], float32
        logits = certified.logits(hidden)
        _, ids, candidates = certified.topk(hidden, logits, args.top_k)
    rows = len(hidden)
    q = torch.quantile(candidates.float(), torch.tensor([0.5, 0.9, 0.99, 1.0])).tolist()
    print(f"{args.model}: {rows} rows ({args.requests} API-Bank requests x last {args.positions} positions)")
    approximate = logits.topk(args.top_k, dim=-1).indices
    print(f"- bfloat16-weight argmax != float32 argmax: {int((approximate[:, 0] != exact[:, 0]).sum())} rows; "
          f"top-{args.top_k} ids differ: {int((approximate != exact).any(-1).sum())} rows")
    print(f"- certified argmax != float32 argmax: {int((ids[:, 0] != exact[:, 0]).sum())} rows; "
          f"top-{args.top_k} ids differ: {int((ids != exact).any(-1).sum())} rows")
    print(f"- candidates per row: mean {candidates.float().mean():.2f}, median {q[0]:.0f}, p90 {q[1]:.0f}, "
          f"p99 {q[2]:.0f}, max {q[3]:.0f}; rows with one: {(candidates == 1).float().mean():.1%}")
    print(f"- candidates per row, mean: {probe_candidates(loaded, certified, args.top_k)}")
    fp32 = SkinnyLinear(loaded.model.get_output_embeddings())
    print(f"\nLM head, ms (fastest of {args.repeats}), {args.threads} threads\n")
    print("| rows | float32 (skinny) + top-k | certified (bfloat16 logits + top-k) | ratio |\n| ---: | ---: | ---: | ---: |")
    with torch.inference_mode():
        for n in (1, 8, 16, 64):
            h = hidden[:n].contiguous()
            full = fastest_ms(lambda: top_k_and_argmax(fp32(h), args.top_k), args.repeats)
            ours = fastest_ms(lambda: certified.topk(h, certified.logits(h), args.top_k), args.repeats)
            print(f"| {n} | {full:.2f} | {ours:.2f} | {ours / full:.2f} |")
    whole_forward_ab(loaded, args.rounds, args.prefix)


if __name__ == "__main__":
    main()
