"""The verifier's cost curve: seconds of one verification against the number of tree nodes.

`CostCurve` is the measured time of one verification (`TreeVerifier.verify`, the call decoding
makes: mask, forward, walk, compaction) against N for one model, verifier and device; N = 1 is
the real autoregressive step. `load_or_measure` caches it on disk keyed by model, device,
processor, thread count, cache length, the verifier's options and library versions: measured
once, then rechecked at each use with a few timed forwards and measured again when its shape has
moved. The budget policies (oilbird/budget.py, oilbird/tree_select.py) read it.
"""

from __future__ import annotations

import json
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from oilbird.budget import BudgetConfig
from oilbird.int8_head import tiles_run
from oilbird.kernels import describe_kernels
from oilbird.skinny_gemm import cpu_info, source_key
from oilbird.tree import DraftTree
from oilbird.tree_attention import attention_kernel


@dataclass
class CostCurve:
    """Seconds per forward against the number of tokens in it, for one model and device."""

    points: dict[int, float]
    """N -> seconds of a forward over N tree tokens (fastest of several runs)."""
    key: str = ""
    """What was measured (model, device, threads, versions)."""

    def cost(self, n: int) -> float:
        """Seconds for a forward over `n` tokens, interpolated linearly between measured sizes."""
        sizes = sorted(self.points)
        if n <= sizes[0]:
            return self.points[sizes[0]]
        for lo, hi in zip(sizes, sizes[1:]):
            if n <= hi:
                frac = (n - lo) / (hi - lo)
                return self.points[lo] + frac * (self.points[hi] - self.points[lo])
        lo, hi = sizes[-2:] if len(sizes) > 1 else (sizes[0], sizes[0])
        slope = (self.points[hi] - self.points[lo]) / (hi - lo) if hi > lo else 0.0
        return self.points[hi] + slope * (n - hi)

    def table(self, sizes: list[int] | None = None) -> str:
        """A markdown table: ms per forward and the ratio to the one-node forward (the AR step)."""
        base = self.cost(1)
        lines = ["| tokens in forward | ms | x autoregressive step |", "| ---: | ---: | ---: |"]
        lines += [f"| {n} | {1000 * self.cost(n):.1f} | {self.cost(n) / base:.2f} |"
                  for n in (sizes or sorted(self.points))]
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"key": self.key, "points": {str(k): v for k, v in sorted(self.points.items())}}

    @classmethod
    def from_json(cls, data: dict) -> "CostCurve":
        return cls(points={int(k): float(v) for k, v in data["points"].items()}, key=data.get("key", ""))


@torch.inference_mode()
def measure_cost_curve(verifier, sizes: list[int], prefix_len: int = 512, repeats: int = 5,
                       key: str = "", fit_monotone: bool = True) -> CostCurve:
    """Time `verifier.verify`, the very call decoding makes, on a chain of N nodes, per N.

    The call includes what decoding pays per forward: the mask (none at N = 1, exactly as an
    autoregressive step), the model forward with the verifier's own options (hidden states, top-k,
    FLy's entropy when it has the rule), the walk and the cache compaction. Each probe runs over a
    cache of `prefix_len` tokens, which is restored after it.

    Args:
        verifier: the `TreeVerifier` the method decodes with.
        sizes: the tree sizes N to time (nodes, root included).
        prefix_len: cached tokens before each probe.
        repeats: timed runs per size (after one warm-up run); the fastest counts.
        key: what the curve depends on (see `cost_curve_key`).
        fit_monotone: fit the timings non-decreasing (`monotone`), as the budgets need; False
            keeps the raw fastest times (scripts/forward_cost.py reports those).

    Returns:
        The curve: N -> seconds per verification forward.
    """
    fastest = probe_times(verifier, sizes, prefix_len, repeats)
    return CostCurve(points=monotone(fastest) if fit_monotone else fastest, key=key)


PROBE_PERIOD = 37
"""The probe's tokens repeat with this period (`probe_tokens`)."""


def probe_tokens(vocab: int, count: int) -> list[int]:
    """`count` tokens of a pseudo-random block of `PROBE_PERIOD` tokens, repeated.

    A probe's cost depends on its tokens through the certified LM head (oilbird/lm_head.py),
    which computes again in float32 every token its error bound cannot rule out: more where the
    model's prediction is flat. Over unrelated tokens that was ~275 per row on SmolLM2, against
    ~48 on API-Bank traffic, and the curve charged the head for it. A repeated block is predicted
    the way repetitive traffic is, by copying (~62 per row), and the probe's chain continues it.
    """
    block = [(7 * i * i + 11 * i + 3) % vocab for i in range(PROBE_PERIOD)]
    return [block[i % PROBE_PERIOD] for i in range(count)]


@torch.inference_mode()
def probe_times(verifier, sizes: list[int], prefix_len: int, repeats: int) -> dict[int, float]:
    """The fastest of `repeats` timed `verifier.verify` calls on an N-node chain, per N in `sizes`.

    Runs over a cache of `prefix_len` tokens, restored after each probe; see `measure_cost_curve`.
    """
    vocab = verifier.model.config.vocab_size
    tokens = probe_tokens(vocab, prefix_len + max(sizes))
    state = verifier.prefill(tokens[: prefix_len + 1])
    anchor = state.anchor
    def probe(n: int) -> float:
        tree = DraftTree.chain(anchor, tokens[prefix_len + 1: prefix_len + n], "probe")
        start = time.perf_counter()
        verifier.verify(state, tree)
        elapsed = time.perf_counter() - start
        extra = state.length - prefix_len  # what the probe committed (its root and accepted path)
        state.cache.crop(-extra)  # transformers 5: a negative count drops that many rows
        state.length, state.anchor = prefix_len, anchor
        return elapsed

    # Warm the allocator and the kernels on the largest and the smallest shape first: without
    # it the first size timed (N = 1) paid a warm-up its repeats did not remove and read slower
    # than N = 2, which made larger trees look cheap to the auto budget.
    for n in (max(sizes), min(sizes)) * 2:
        probe(n)
    # Round robin over the sizes, so that a slow spell of the host (a noisy neighbor, a clock
    # change) lands on every size alike instead of on the few it happened to coincide with.
    times: dict[int, list[float]] = {n: [] for n in sizes}
    for round_ in range(repeats + 1):
        for n in sizes:
            elapsed = probe(n)
            if round_:  # the first round warms up every shape
                times[n].append(elapsed)
    # The fastest run, not the median: another process sharing the cores only ever adds time,
    # and a curve measured under load would otherwise keep that load's bumps.
    return {n: min(t) for n, t in times.items()}


def monotone(points: dict[int, float]) -> dict[int, float]:
    """The least-squares non-decreasing fit of a cost curve (pool adjacent violators).

    The budgets compare tree sizes by this curve; a dip (8 nodes timed below 1 in a noisy run, or
    PyTorch's MKL path, whose 2-row GEMM is slower than its 4-row one) would make them pick trees
    for a cost that does not hold at neighboring sizes. Violating neighbors are pooled into
    their mean; a curve that is already monotone is returned unchanged.
    """
    blocks: list[list[float]] = []  # [sum, count] of pooled runs, in order of size
    for n in sorted(points):
        blocks.append([points[n], 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    fitted = [total / count for total, count in blocks for _ in range(count)]
    return dict(zip(sorted(points), fitted))


def cost_curve_key(loaded, verifier, prefix_len: int, threads: int | None = None) -> str:
    """What a cost curve depends on: model file, device, threads, cache length, the verifier's
    options (top-k, hidden states, FLy) and library versions."""
    import transformers

    threads = threads or torch.get_num_threads()
    kernels = describe_kernels(verifier.model, prefill=False)  # the curve times no prefill
    if "skinny" in kernels:  # our kernels change with their sources and choice, not with their name
        kernels += f"@{source_key()}:{attention_kernel()}"
    head = verifier.head_kind
    if head == "int8" and verifier.config.head_tiles and tiles_run():  # same bits, another cost
        head += f"+tiles>={verifier.config.head_tiles}"
    options = (f"verify:top_k={verifier.config.top_k},kernels={kernels},head={head},"
               f"fly={verifier.fly is not None and verifier.fly.entropy}")
    return (f"{Path(loaded.source).name}|{loaded.device}|cpu={host_cpu()}|threads={threads}|prefix={prefix_len}"
            f"|min,warm,rr,mono,copy"
            f"|{options}|torch={torch.__version__}|transformers={transformers.__version__}")


RECHECK_SIZES = (8, 16, 64)  # besides the smallest: where budgets are chosen and curves bend


def recheck_sizes(known: dict[int, float]) -> list[int]:
    """The sizes a recheck times: the smallest, and those of `RECHECK_SIZES` the curve holds (its
    largest size when it holds none of them)."""
    if not known:
        return []
    smallest = min(known)
    others = [n for n in RECHECK_SIZES if n in known and n > smallest]
    return [smallest] + (others or [n for n in (max(known),) if n > smallest])


def moved_sizes(cached: dict[int, float], fresh: dict[int, float], tolerance: float) -> list[int]:
    """Sizes whose cost relative to the smallest size moved by more than `tolerance` (a fraction).

    Only the shape matters to a budget (it maximizes tokens per second, and a host that is slower
    at every size alike picks the same budget), so each curve is divided by its own smallest size.

    Args:
        cached: N -> seconds of the stored curve.
        fresh: N -> seconds just timed, at sizes the stored curve holds (the smallest included).

    Returns:
        The sizes that moved, smallest first (empty: the stored curve still holds).
    """
    base = min(fresh)
    return [n for n in sorted(fresh) if n != base
            and abs((fresh[n] / fresh[base]) / (cached[n] / cached[base]) - 1) > tolerance]


def stale_reason(cached: dict[int, float], fresh: dict[int, float], config: BudgetConfig) -> str | None:
    """Why a recheck's timings (`fresh`) retire the cached curve, or None when it still holds.

    Two ways: its shape moved (`moved_sizes`, beyond `recheck_tolerance`), or the host now runs
    the smallest size more than `recheck_faster` faster than the curve says. The curve keeps the
    fastest run of each size, so a faster recheck means it was timed in a slow spell; that adds
    about the same milliseconds to every size (a busy memory bus slows the one-node step, which
    streams the weights, as much as a larger forward) and so flattens the shape the budgets read.
    """
    moved = moved_sizes(cached, fresh, config.recheck_tolerance)
    if moved:
        return (f"its cost at {','.join(map(str, moved))} nodes moved more than "
                f"{config.recheck_tolerance:.0%} against the one-node step")
    base = min(fresh)
    if fresh[base] < (1 - config.recheck_faster) * cached[base]:
        return (f"{base} node(s) now take {1e3 * fresh[base]:.1f} ms against its {1e3 * cached[base]:.1f} ms "
                f"(more than {config.recheck_faster:.0%} faster: it was timed in a slow spell)")
    return None


def host_cpu() -> str:
    """The processor, as far as costs go: family, model and widest vector ISA ('x86_64/25.17/avx512').

    Part of the cost-curve key, so a cache carried to another machine is not reused there (two
    hosts that both call themselves 'AMD EPYC' may differ by a generation and by AVX-512).
    """
    fields = cpu_info()
    if not fields:  # not Linux: the platform's own description
        return platform.machine() + "/" + (platform.processor() or "unknown")
    flags = fields.get("flags", "").split()
    isa = "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "base"
    return f"{platform.machine()}/{fields.get('cpu family', '?')}.{fields.get('model', '?')}/{isa}"


def load_or_measure(loaded, verifier, config: BudgetConfig, cache_dir: Path, log=lambda m: None) -> CostCurve:
    """The cached cost curve of `verifier` over `loaded` on this device, measured on first use.

    A cached curve is rechecked first (`BudgetConfig.recheck`): a few sizes are timed again and,
    when the curve's shape has moved beyond `recheck_tolerance` or the host now runs its smallest
    size faster than it says (`stale_reason`), every size is measured anew.

    Args:
        loaded: the target (`LoadedModel`): names the model file and device in the key.
        verifier: the `TreeVerifier` the method decodes with (see `measure_cost_curve`).
        config: the candidate sizes (`grid`), the cache length (`cost_prefix`), the recheck.
        cache_dir: where `cost-curves.json` lives.
        log: receives a message when a measurement starts or a cached curve is found stale.
    """
    key = cost_curve_key(loaded, verifier, config.cost_prefix)
    path = cache_dir / "cost-curves.json"
    curves = json.loads(path.read_text()) if path.exists() else {}
    known = CostCurve.from_json(curves[key]).points if key in curves else {}
    missing = [n for n in config.sizes() if n not in known]
    check = recheck_sizes(known)
    if config.recheck and len(check) > 1:  # a shape needs two sizes
        why = stale_reason(known, probe_times(verifier, check, config.cost_prefix, repeats=3), config)
        if why:
            log(f"the cached cost curve no longer holds: {why}; measuring it again")
            known, missing = {}, config.sizes()
    if not missing:
        return CostCurve(points=known, key=key)
    log(f"measuring forward cost for budgets {','.join(map(str, missing))} (once per model, device and verifier)")
    curve = measure_cost_curve(verifier, missing, config.cost_prefix, key=key)
    curve.points = {**known, **curve.points}  # a smaller grid later never forgets measured sizes
    curves[key] = curve.to_json()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(curves, indent=1))
    tmp.replace(path)
    return curve
