"""The int8 LM head on real traffic: do its top-k and argmax equal float32's, how many tokens per
row does it compute again, and what does the head cost against the byte plane's float32 kernel.

Decodes the first `--requests` API-Bank requests greedily with transformers (the audit's
reference) and takes the final hidden state at the last `--positions` positions of each
(decoding's own rows; scripts/certified_head.py's rows). For those rows it reports how often the
rounded-input logits' own argmax and top-k differ from the float32 kernel's (what an uncertified
int8 head would get wrong), how often the certified ones do (must be never, up to float32
near-ties), the candidates per row the bound leaves, and ms of the head alone at 1, 8, 16 and 64
rows on both (fastest of `--repeats`; top-k included). Whole forwards:
`scripts/forward_ab.py --a head=model --b head=int8`. docs/RESULTS.md, issue 15, stop 54,
records its output.

With `--tiles` (CPUs with AMX-INT8) it times instead the int8 logits alone on the two paths that
give them the same bits, VNNI dot products and AMX tiles, at 1 to 64 rows, checks the bits equal,
and prints the ratio: where `VerifierConfig.head_tiles` should start (stop 63 records it).

Usage:
  .venv/bin/python scripts/int8_head.py --threads 1
  .venv/bin/python scripts/int8_head.py --threads 1 --model qwen2.5-coder-0.5b --requests 10
  .venv/bin/python scripts/int8_head.py --threads 1 --tiles --requests 2 --positions 32
"""

from __future__ import annotations

import torch
from attention_cost import fastest_ms  # scripts/ is on the path when run as a script
from certified_head import final_hidden_rows, head_arguments

from oilbird.int8_head import Int8Head, int8_head_unavailable, tiles_run
from oilbird.lm_head import top_k_and_argmax
from oilbird.models import load_model
from oilbird.skinny_gemm import kernels

TILE_ROWS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64)


def tiles_against_vnni(int8: Int8Head, hidden: torch.Tensor, repeats: int, threads: int) -> None:
    """The int8 logits on VNNI and on AMX tiles at `TILE_ROWS` rows: ms, ratio, same bits."""
    print(f"\nint8 logits alone (no top-k), ms, fastest of {repeats}, {threads} threads\n")
    print("| rows | VNNI | tiles | tiles / VNNI | same bits |\n| ---: | ---: | ---: | ---: | --- |")
    for n in TILE_ROWS:
        h = hidden[:n].contiguous()
        vnni, tiles = (kernels().int8_head_logits(h, int8.packed, kind) for kind in ("vnni", "tiles"))
        same = all(torch.equal(a, b) for a, b in zip(vnni, tiles))
        ms = {kind: fastest_ms(lambda: kernels().int8_head_logits(h, int8.packed, kind), repeats)
              for kind in ("vnni", "tiles")}
        print(f"| {n} | {ms['vnni']:.2f} | {ms['tiles']:.2f} | {ms['tiles'] / ms['vnni']:.2f} | {same} |")


def main() -> None:
    parser = head_arguments(__doc__.split("\n\n")[0], threads=1)
    parser.add_argument("--tiles", action="store_true", help="time the VNNI and AMX-tiles paths instead")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(args.model)
    model = loaded.tree_model()
    why = int8_head_unavailable(model)
    if why is not None:
        raise SystemExit(f"the int8 head cannot run here: {why}")
    head = model.get_output_embeddings()  # BlockLinear over the Q8_0 blocks' byte plane
    hidden = final_hidden_rows(loaded, args.requests, args.positions, args.new_tokens)  # [rows, d]
    int8 = Int8Head(head)
    if args.tiles:
        if not tiles_run():
            raise SystemExit("the int8 head's tiles need AMX-INT8 (a Xeon since Sapphire Rapids) granted by the OS")
        if len(hidden) < max(TILE_ROWS):
            raise SystemExit(f"--tiles needs {max(TILE_ROWS)} rows: raise --requests or --positions")
        return tiles_against_vnni(int8, hidden, args.repeats, args.threads)
    with torch.inference_mode():
        exact, _, _ = top_k_and_argmax(head(hidden), args.top_k)  # [rows, k], the float32 kernel's
        logits, _, ids = int8.greedy(hidden, args.top_k)
    approximate, _, _ = top_k_and_argmax(logits, args.top_k)
    rows = len(hidden)
    print(f"{args.model}: {rows} rows ({args.requests} API-Bank requests x last {args.positions} positions)")
    print(f"- rounded-input argmax != float32 argmax: {int((approximate[:, 0] != exact[:, 0]).sum())} rows; "
          f"top-{args.top_k} ids differ: {int((approximate != exact).any(-1).sum())} rows")
    print(f"- certified argmax != float32 argmax: {int((ids[:, 0] != exact[:, 0]).sum())} rows; "
          f"top-{args.top_k} ids differ: {int((ids != exact).any(-1).sum())} rows")
    print(f"- candidates per row computed again in float32: mean {int8.candidates / rows:.1f}")
    print(f"\nLM head alone, ms (fastest of {args.repeats}), {args.threads} threads\n")
    print("| rows | float32 kernel on the byte plane + top-k | int8 logits + certified top-k | ratio |")
    print("| ---: | ---: | ---: | ---: |")
    with torch.inference_mode():
        for n in (1, 8, 16, 64):
            h = hidden[:n].contiguous()
            plane = fastest_ms(lambda: top_k_and_argmax(head(h), args.top_k), args.repeats)
            ours = fastest_ms(lambda: int8.greedy(h, args.top_k), args.repeats)
            print(f"| {n} | {plane:.2f} | {ours:.2f} | {ours / plane:.2f} |")


if __name__ == "__main__":
    main()
