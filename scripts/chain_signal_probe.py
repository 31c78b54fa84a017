"""Would Oilbird's vLLM chains be cut better with one more signal per node? An offline probe.

The chain policy (oilbird/integrations/vllm/chain_policy.py) estimates, per node key (source tags,
depth, score bin), the probability that a node is accepted given its parent was, and cuts a chain
where the probability of reaching the next node falls below a threshold. This probe replays a
`scripts/drafter_replay.py --record` recording of `oilbird` and asks what the same cut would give
if the key also held one of these signals about each chain node:

- `suffix`: whether our SuffixDecoding drafter, fed the same committed text, drafts the same
  tokens up to this node (and, if so, its probability bin);
- `unanimous`: whether every past occurrence of the matched text continued the same way, read
  from the spine's suffix automata (one outgoing transition of the matched state), for the
  automaton of the longest match, or for the request's own and the pool's automata apart.

Greedy verification accepts a prefix of the chain, so any cut of the recorded chain is scored
exactly from what was committed. Two estimates are printed per threshold: in-sample (each key's
acceptance counted over the whole run: the information a signal holds, an upper bound) and
online (counted from earlier steps only, starting from the chain policy's optimistic prior, and
learning only from the part of each chain verified: what a policy could use). Cuts only: chains
Oilbird did not propose cannot be scored, and the drafter's later state is taken as recorded.

Usage:
  .venv/bin/python scripts/drafter_replay.py --record /tmp/stream-rec.pt --workload stream --methods oilbird
  .venv/bin/python scripts/chain_signal_probe.py /tmp/stream-rec.pt
"""

from __future__ import annotations

import argparse
import pickle
import sys

import torch

import chain_sim  # scripts/ is on sys.path
from oilbird.acceptance import AcceptanceModel, node_key
from oilbird.integrations.vllm.adapter import EngineDrafter, StepRequest

THRESHOLDS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.47)


def out_degrees(sam, state: int, length: int, chain: list[int]) -> list[object]:
    """Per chain token: how many distinct tokens followed the matched text in `sam` (capped at 3),
    walking the chain's own transitions; 'root' where nothing is matched, 'off' past the match."""
    degrees: list[object] = []
    for token in chain:
        if state is None:
            degrees.append("off")
            continue
        degrees.append(min(len(sam.next[state]), 3) if length > 0 else "root")
        state, length = sam.next[state].get(token), length + 1
    return degrees


def agreement(chain: list[int], other: list[int], probs: list[float]) -> list[tuple]:
    """Per chain token: ('sfx', probability bin) while `other` drafts the same prefix, else ('no',)."""
    out = []
    for j in range(len(chain)):
        if j < len(other) and chain[:j + 1] == other[:j + 1]:
            out.append(("sfx", min(3, int(probs[j] * 4))))
        else:
            out.append(("no",))
    return out


def collect(events: list, settings: list[str]) -> list[dict]:
    """Replay the recording: per verified chain, its tokens, node keys, signals and accepted count."""
    oil = EngineDrafter.build(chain_sim.engine_config("oilbird", settings))
    sfx = EngineDrafter.build(chain_sim.engine_config("suffix", ["length_policy=fixed"]))
    spine = oil.drafter.host.pool_spine
    pending, chains = {}, []
    for event in events:
        if event[0] == "finish":
            oil.finish(event[1])
            sfx.finish(event[1])
            pending.pop(event[1], None)
            continue
        _, batch, max_drafts, recorded = event
        for r in batch:
            if r.request_id in pending and r.committed:
                chains.append(dict(pending.pop(r.request_id), accepted=len(r.committed) - 1))
        if oil.step(batch, max_drafts) != recorded:
            raise SystemExit("chain_signal_probe: the replay proposed other chains than recorded; "
                             "record again with this checkout")
        # SuffixDecoding sees the same committed text, as if it had drafted it.
        sfx_chains = sfx.step([StepRequest(r.request_id, r.prompt_ids, r.tenant, list(r.committed[:-1]),
                                           list(r.committed), max_output=r.max_output, stop_ids=r.stop_ids)
                               for r in batch], max_drafts)
        for r, chain, other in zip(batch, recorded, sfx_chains):
            if not r.committed or not chain:
                continue
            tree, state = oil.proposed[r.request_id], spine.state(r.request_id)
            best = spine._cursors(state)[0]  # the match the spine copied from
            local, pool = state.local_cursor, state.pool_cursor
            pending[r.request_id] = dict(
                keys=[node_key(tree, n) for n in range(1, len(tree))],
                suffix=agreement(chain, other, sfx.proposed[r.request_id].scores[1:]),
                best=out_degrees(best.sam, best.state, best.length, chain),
                local=out_degrees(local.sam, local.state, local.length, chain),
                pool=out_degrees(pool.sam, pool.state, pool.length, chain))
    return chains


SIGNALS = {
    "none (today's keys)": lambda c, j: (),
    "suffix agreement": lambda c, j: c["suffix"][j],
    "unanimous, longest match": lambda c, j: (c["best"][j] == 1,),
    "unanimous, own and pool apart": lambda c, j: (c["local"][j] == 1, c["pool"][j] == 1),
}


def cut_counts(chains: list[dict], signal, threshold: float, online: bool) -> tuple[int, int]:
    """Draft tokens and accepted tokens when each chain is cut at `threshold` reach."""
    keyed = [([c["keys"][j] + tuple(signal(c, j)) for j in range(len(c["keys"]))], c["accepted"])
             for c in chains]
    model = AcceptanceModel()
    if not online:
        for keys, accepted in keyed:
            _learn(model, keys, accepted, len(keys))
    drafts = accepted_total = 0
    for keys, accepted in keyed:
        reach, length = 1.0, 0
        for key in keys:
            reach *= model.p_accept(key)
            if reach < threshold:
                break
            length += 1
        drafts, accepted_total = drafts + length, accepted_total + min(length, accepted)
        if online:
            _learn(model, keys, accepted, length)
    return drafts, accepted_total


def _learn(model: AcceptanceModel, keys: list, accepted: int, verified: int) -> None:
    for j, key in enumerate(keys[:verified]):
        if j > accepted:  # its parent was rejected: not tried
            break
        entry = model.counts.setdefault(key, [0, 0])
        entry[0] += 1
        entry[1] += j < accepted


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("recording", help="a drafter_replay.py --record file holding an 'oilbird' entry")
    args = p.parse_args(argv)
    try:
        saved = torch.load(args.recording, weights_only=False)  # our own recording: trusted pickles
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError) as e:
        raise SystemExit(f"chain_signal_probe: cannot read {args.recording!r} ({e})") from None
    if not isinstance(saved, dict) or "oilbird" not in saved:
        raise SystemExit(f"chain_signal_probe: {args.recording!r} holds no 'oilbird' recording "
                         "(drafter_replay.py --record FILE --methods oilbird)")
    chains = collect(saved["oilbird"]["events"], saved["oilbird"]["settings"])
    recorded = (sum(len(c["keys"]) for c in chains), sum(c["accepted"] for c in chains))
    print(f"{len(chains)} chains verified; as recorded: {recorded[0]} draft tokens, {recorded[1]} accepted\n")
    print("| signal | estimate | " + " | ".join(f"reach {t}" for t in THRESHOLDS) + " |")
    print("|---|---|" + "---:|" * len(THRESHOLDS))
    for name, signal in SIGNALS.items():
        for online in (False, True):
            cells = [cut_counts(chains, signal, t, online) for t in THRESHOLDS]
            print(f"| {name} | {'online' if online else 'in-sample'} | "
                  + " | ".join(f"{d} / {a}" for d, a in cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
