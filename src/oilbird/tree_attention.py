"""Tree attention without copying the cache per head group, registered with transformers.

transformers' SDPA path handles grouped-query attention (GQA: fewer key/value heads than query
heads) without copies only when there is no mask. A tree forward needs a custom 4-D mask, and
then `repeat_kv` copies every layer's whole cached K and V once per query group (3x for SmolLM2's
9/3 heads, 7x for Qwen2.5's 14/2) before attending over the copies: work that grows with the
cache, paid by every tree forward and by none of the autoregressive steps.

`tree_attention` is the same computation with `enable_gqa=True`: PyTorch's SDPA reads each
key/value head for its query group in place, mask or no mask. On the CPU kernels this is
bit-identical to the copying path (tests/test_tree_attention.py checks it). Forwards without a
mask (prefill, autoregressive steps) go to transformers' own SDPA function unchanged.

`skinny_tree_attention` computes the same on our kernels (oilbird/csrc/tree_attention*.{cpp,h}):
every query head of a group reads its key/value head in place. On an AVX2 host it is two-pass
attention per tile of query rows (scores of 3 rows x 4 cached keys per step, a plain softmax,
then the values), as fast as PyTorch's CPU SDPA or faster at every size measured, one-token
steps included (1.4-3.3x at 1-8 nodes, 1.0-1.2x at 64, one or two threads; docs/RESULTS.md,
issue 15); on an AVX-512 host attention with 16 query rows in a register's lanes (a lane-wise
softmax, no reductions across lanes) at every size, though two-pass is ~1% faster for one-token
steps, so that every forward sums in the same order (`INVARIANT_KERNEL`). Both prefetch the cache's rows, which decoding reads cold. One-token steps (no
mask) use them too, and so does a prefill (several tokens, no mask: causal) of up to
`CAUSAL_MAX_KV_BYTES` (per kernel), in the kernels' causal mode, which skips the keys a tile of
rows cannot see; a prefill over a reused cached prefix too, since the mask
builder registered with it (`prefix_causal_mask`) leaves out the causal mask SDPA's builds there
(past `CAUSAL_MAX_KV_BYTES` it keeps that mask, for the kernel's masked path). Exact up
to rounding (it sums in another order), float32 on a CPU, head_dim 64 or 128; a bfloat16 model's
layers run it on inputs widened to float32. On AVX-512 a tree node's bits thus equal the
one-token step's over its path (bfloat16 needs that: its logits tie often); anything else goes to
SDPA as above.

The functions are registered under `TREE_ATTENTION` and `SKINNY_ATTENTION` through transformers'
`AttentionInterface` (and a mask builder under the same names through `AttentionMaskInterface`:
SDPA's for `TREE_ATTENTION`, so `generate()` and the prefill build exactly the masks SDPA would;
`prefix_causal_mask` for `SKINNY_ATTENTION`). A model opts in with
`model.set_attn_implementation(TREE_ATTENTION)`; `oilbird.kernels.tree_model` does that on its
own copy of the model, never on the caller's.
"""

from __future__ import annotations

from functools import lru_cache

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, causal_mask_function, sdpa_mask

from oilbird.errors import ModelError
from oilbird.skinny_gemm import kernels, skinny_available

TREE_ATTENTION = "oilbird_tree"
"""The attention implementation name models are switched to (`model.set_attn_implementation`)."""


def tree_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                   value: torch.Tensor, attention_mask: torch.Tensor | None,
                   dropout: float = 0.0, scaling: float | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """Attention for one layer; the signature of transformers' attention functions.

    Args:
        module: the attention module (its `num_key_value_groups` says whether heads are grouped).
        query: [B, H_q, N, D] queries of the N tokens in the forward.
        key: [B, H_kv, S, D] keys of the cache and the N tokens (S = cached + N).
        value: [B, H_kv, S, D] their values.
        attention_mask: [B or 1, 1, N, S] additive mask (the tree's), or None.
        dropout: attention dropout (0 at inference).
        scaling: the softmax scale (1/sqrt(D) when None).

    Returns:
        ([B, N, H_q, D] attention output, None): what transformers' attention modules expect.
    """
    groups = getattr(module, "num_key_value_groups", 1)
    if attention_mask is None or query.shape[2] == 1 or groups == 1:
        # Nothing to save: no mask means transformers already attends without copies.
        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      dropout=dropout, scaling=scaling, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling,
        enable_gqa=True)  # [B, H_q, N, D]
    return out.transpose(1, 2).contiguous(), None


SKINNY_ATTENTION = "oilbird_skinny"
"""The name of the skinny-kernel variant (`skinny_tree_attention`)."""
SKINNY_HEAD_DIMS = (64, 128)
"""Head dims the skinny kernel supports."""
CAUSAL_MAX_KV_BYTES = {"two-pass": 384 * 1024, "lanes": 4 * 1024 * 1024}
"""Per kernel, the prefills that run on its causal mode: while one key/value head's keys and
values fit in so many bytes. The two-pass kernel: 768 keys at head_dim 64, while they stay in a
core's L2 cache (1 MB on Zen 4, 512 KB on Zen 3) across a tile's passes; past that SDPA, which
blocks over keys, was the faster. The lanes kernel (AVX-512 builds): 8192 keys at head_dim 64,
the longest prompt measured, where it took 0.59x SDPA's time (scripts/attention_cost.py
--prefill; docs/RESULTS.md, issue 15). Longer prompts go to SDPA (a prefill over a cached prefix:
the kernel's masked path)."""


INVARIANT_KERNEL = "lanes"
"""The kernel every forward runs on where the build has it fast (AVX-512): with query rows in its
lanes, a row's sums run over the keys in order, masked keys adding exact zeros, so a tree node
gets the bits of the one-token step over its path (tests/test_tree_attention.py checks it), and
speculation cannot change our own greedy output. 'two-pass' sums keys in groups and does not;
AVX2 builds run it at every size (the faster there, docs/RESULTS.md) and are exact up to
rounding only. On SmolLM2 one-token steps 'lanes' costs ~1% more than 'two-pass' did (stop 41)."""


@lru_cache(maxsize=1)
def attention_kernel() -> str:
    """The kernel every forward runs on here, whatever its rows: `INVARIANT_KERNEL` on AVX-512
    builds, 'two-pass' on AVX2 builds and where there is no module (built once per process:
    every layer of every forward asks)."""
    if not skinny_available()[0]:
        return "two-pass"
    build = kernels().default_kernel(1 << 20)  # the module's choice for many rows: 'lanes' where it has it
    return INVARIANT_KERNEL if build == INVARIANT_KERNEL else "two-pass"


def causal_mode_fits(keys: int, head_dim: int, element_size: int = 4) -> bool:
    """Whether a causal forward over `keys` keys runs the kernel's causal mode
    (`CAUSAL_MAX_KV_BYTES` of `attention_kernel()`)."""
    return 2 * keys * head_dim * element_size <= CAUSAL_MAX_KV_BYTES[attention_kernel()]


def prefix_causal_mask(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0,
                       kv_offset: int = 0, mask_function=causal_mask_function,
                       attention_mask: torch.Tensor | None = None,
                       allow_is_causal_skip: bool = True, **kwargs) -> torch.Tensor | None:
    """SDPA's mask builder, except that a plain causal prefill over a cached prefix gets no mask.

    `sdpa_mask` returns None (causal, no mask built) only when the forward's tokens are all the
    keys; a prefill over a reused prefix (`oilbird.prefix_cache`) then gets an [N, S] mask, and
    the skinny kernel would run its masked path. `skinny_tree_attention` reads "no mask, several
    tokens" as causal with lower-right alignment, for any number of cached keys, so here the
    mask is left out whenever it would be exactly that (one sequence, no padding, plain causal)
    and the keys fit the causal mode (`causal_mode_fits`); longer ones keep SDPA's mask, built
    here once per forward, for the kernel's masked path. On the make-bench requests that made
    such prefills 2% faster in sum than the masked path (scripts/prefix_prefill_cost.py;
    docs/RESULTS.md, issue 15).

    Args and Returns: as transformers' `sdpa_mask` (the `AttentionMaskInterface` signature).
    """
    config = kwargs.get("config")
    head_dim = getattr(config, "head_dim", None) or (
        config.hidden_size // config.num_attention_heads if config is not None else None)
    plain = (head_dim is not None and causal_mode_fits(kv_length, head_dim)
             and batch_size == 1 and kv_offset == 0 and allow_is_causal_skip
             and mask_function is causal_mask_function and kwargs.get("local_size") is None
             and kv_length == int(q_offset) + q_length
             and (attention_mask is None or bool(attention_mask.all())))
    if plain:
        return None
    return sdpa_mask(batch_size, q_length, kv_length, q_offset=q_offset, kv_offset=kv_offset,
                     mask_function=mask_function, attention_mask=attention_mask,
                     allow_is_causal_skip=allow_is_causal_skip, **kwargs)


def skinny_tree_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                          value: torch.Tensor, attention_mask: torch.Tensor | None,
                          dropout: float = 0.0, scaling: float | None = None,
                          **kwargs) -> tuple[torch.Tensor, None]:
    """`tree_attention` on the skinny kernel where it applies (see the module docstring).

    Args and Returns: as `tree_attention`.
    """
    # Without a mask a forward of several tokens is causal (a prefill, perhaps over a cached
    # prefix: `prefix_causal_mask`): the kernel's causal mode, lower-right aligned.
    causal = attention_mask is None and query.shape[2] > 1
    too_long = causal and not causal_mode_fits(key.shape[2], key.shape[3], 4)  # float32 on the kernel
    covered = (query.shape[0] == 1 and not dropout and query.dtype in (torch.float32, torch.bfloat16)
               and query.device.type == "cpu" and query.shape[-1] in SKINNY_HEAD_DIMS
               and kwargs.get("s_aux") is None)
    if causal and key.shape[2] != query.shape[2] and (too_long or not covered):
        # Over a cached prefix, beyond the causal mode (`prefix_causal_mask` keeps the mask for
        # these; a direct caller may not): SDPA's `is_causal` aligns upper-left, right only when
        # S == N, so the lower-right mask is spelled out.
        attention_mask = sdpa_mask(1, query.shape[2], key.shape[2], q_offset=key.shape[2] - query.shape[2],
                                   allow_is_causal_skip=False, device=query.device)  # [1, 1, N, S]
        causal = too_long = False
    if too_long or not covered:  # too long: a prompt prefilled whole, SDPA's `is_causal`
        return tree_attention(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    if attention_mask is not None and attention_mask.dtype == torch.bool:  # True = attend
        attention_mask = torch.zeros_like(attention_mask, dtype=query.dtype).masked_fill_(
            ~attention_mask, torch.finfo(query.dtype).min)
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    kernel = attention_kernel()
    if query.dtype == torch.bfloat16:
        # On the float32 kernel: inputs widened (exact; the verifier keeps such a model's cache in
        # float32 already), the output rounded to bfloat16 once.
        mask = None if attention_mask is None else attention_mask.float()  # [1, 1, N, S]
        out = kernels().tree_attention(query.float(), key.float(), value.float(), mask, scale, kernel, causal)
        return out.to(torch.bfloat16), None  # [1, N, H_q, D]
    return kernels().tree_attention(query, key, value, attention_mask, scale, kernel, causal), None  # [1, N, H_q, D]


AttentionInterface.register(TREE_ATTENTION, tree_attention)
AttentionMaskInterface.register(TREE_ATTENTION, sdpa_mask)
AttentionInterface.register(SKINNY_ATTENTION, skinny_tree_attention)
AttentionMaskInterface.register(SKINNY_ATTENTION, prefix_causal_mask)


def check_tree_attention(config) -> None:
    """Refuse models whose attention cannot honor a custom 4-D tree mask.

    Flash-attention kernels ignore custom masks, and a sliding-window or chunked layer would have
    its window replaced (not narrowed) by the tree mask; either would silently break losslessness.

    Raises:
        ModelError: naming the problem and what to do.
    """
    impl = getattr(config, "_attn_implementation", None) or "sdpa"
    if impl not in ("sdpa", "eager", TREE_ATTENTION, SKINNY_ATTENTION):
        raise ModelError(f"attention implementation {impl!r} ignores custom tree masks; "
                         "load the model with attn_implementation='sdpa' or 'eager'")
    layer_types = getattr(config, "layer_types", None) or ()
    windowed = sorted({t for t in layer_types if t != "full_attention"})
    if windowed:
        raise ModelError(f"the model has {', '.join(windowed)} layers; tree verification "
                         "supports full-attention models only")
