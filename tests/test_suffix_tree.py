"""Suffix tree: counts, depth limit, online appends, removal and speculation against brute force."""

import heapq
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oilbird.suffix_tree import SuffixTree


def brute_counts(seqs, depth):
    """Every substring of length <= depth -> number of suffix occurrences passing through it."""
    counts = Counter()
    for seq in seqs:
        for i in range(len(seq)):
            for d in range(1, min(depth, len(seq) - i) + 1):
                counts[tuple(seq[i:i + d])] += 1
    return dict(counts)


def built(seqs, depth):
    """A tree built from whole sequences, one after another."""
    tree = SuffixTree(depth)
    for seq_id, seq in enumerate(seqs):
        tree.extend(seq_id, seq)
    return tree


# --- brute-force speculation over the uncompressed trie (one token per step, as §3 reads) ------

def _children(counts, string):
    kids = [(counts[string + (t,)], t) for t in {s[-1] for s in counts
                                                  if len(s) == len(string) + 1 and s[:-1] == string}]
    return sorted(kids, key=lambda kt: (-kt[0], kt[1]))


def _ratio(prob, child_count, node_count):
    return prob if child_count == node_count else prob * child_count / node_count


def brute_path(counts, string, budget, min_prob):
    tokens, prob = [], 1.0
    while len(tokens) < budget:
        kids = _children(counts, string)
        if not kids:
            break
        node_count = counts[string]
        count, token = kids[0]
        prob = prob if count == node_count else prob * (count / node_count)
        if prob < min_prob:
            break
        tokens.append((token, len(tokens) - 1, prob))
        string += (token,)
    return tokens


def brute_tree(counts, string, budget, min_prob):
    out, heap, pushes = [], [], 0

    def expand(string, prob, parent):
        nonlocal pushes
        ranked = [(c, t) for c, t in _children(counts, string)
                  if _ratio(prob, c, counts[string]) >= min_prob]
        for count, token in reversed(ranked):  # latest push wins ties: rank order
            pushes -= 1
            heapq.heappush(heap, (-_ratio(prob, count, counts[string]), pushes, string + (token,), parent))

    expand(string, 1.0, -1)
    while heap and len(out) < budget:
        neg, _, string, parent = heapq.heappop(heap)
        out.append((string[-1], parent, -neg))
        expand(string, -neg, len(out) - 1)
    return out


def brute_speculate(seqs, depth, context, max_spec, alpha, offset, min_prob, use_tree):
    counts = brute_counts(seqs, depth)
    ctx = context[-depth:]
    best, best_score, best_m = [], 0.0, 0
    for m in range(1, len(ctx)):
        string = tuple(ctx[len(ctx) - m:])
        if string not in counts:
            break
        budget = min(max_spec, int(alpha * m + offset + 1e-6))
        draft = (brute_tree if use_tree else brute_path)(counts, string, budget, min_prob)
        score = sum(p for _, _, p in draft)
        if draft and score >= best_score:
            best, best_score, best_m = draft, score, m
    return best, best_m


# --- structure -----------------------------------------------------------------------------

def test_counts_after_inserting_sequences():
    tree = built([[1, 2, 3, 1, 2]], depth=3)
    assert tree.path_counts() == {
        (1,): 2, (2,): 2, (3,): 1,
        (1, 2): 2, (2, 3): 1, (3, 1): 1,
        (1, 2, 3): 1, (2, 3, 1): 1, (3, 1, 2): 1,
    }
    # Compressed: "1 2" branches (into "3" and the end of a suffix), as does "2"; "3 1 2" is one edge.
    assert tree.structure() == ((), 5, (
        ((1, 2), 2, (((3,), 1, ()),)),
        ((2,), 2, (((3, 1), 1, ()),)),
        ((3, 1, 2), 1, ()),
    ))
    tree.check()


def test_counts_add_up_across_sequences():
    tree = built([[7, 8, 9], [7, 8, 5]], depth=4)
    counts = tree.path_counts()
    assert counts[(7,)] == 2 and counts[(7, 8)] == 2
    assert counts[(7, 8, 9)] == 1 and counts[(7, 8, 5)] == 1
    assert counts[(8,)] == 2 and counts[(9,)] == 1


def test_depth_limit_respected():
    seq = [1, 2, 3, 4, 5, 6, 7, 8]
    tree = built([seq], depth=3)
    assert max(len(s) for s in tree.path_counts()) == 3
    assert (1, 2, 3, 4) not in tree.path_counts()
    assert tree.path_counts() == brute_counts([seq], 3)


def test_compression_keeps_nodes_linear_in_tokens():
    seq = list(range(500))  # all suffixes distinct: an uncompressed trie would need ~500 x 64 nodes
    tree = built([seq], depth=64)
    assert tree.num_nodes == 501  # the root plus one leaf edge per suffix
    tree.check()


def test_remove_unknown_sequence_raises():
    with pytest.raises(KeyError):
        SuffixTree(4).remove("nope")


seqs_strategy = st.lists(st.lists(st.integers(0, 2), min_size=0, max_size=14), min_size=1, max_size=4)


@settings(max_examples=300, deadline=None)
@given(seqs=seqs_strategy, depth=st.integers(1, 6), order=st.randoms(use_true_random=False))
def test_appending_token_by_token_equals_inserting_whole_sequences(seqs, depth, order):
    # Interleave the sequences' tokens in a random order, as concurrent requests would.
    schedule = [i for i, seq in enumerate(seqs) for _ in seq]
    order.shuffle(schedule)
    tree, grown = SuffixTree(depth), [[] for _ in seqs]
    for i in schedule:
        token = seqs[i][len(grown[i])]
        grown[i].append(token)
        tree.append(i, token)
    tree.check()
    assert tree.path_counts() == brute_counts(seqs, depth)
    whole = SuffixTree(depth)
    for i, seq in enumerate(seqs):
        if seq:
            whole.extend(i, seq)
    assert tree.structure() == whole.structure()  # canonical: the order of appends leaves no trace
    assert tree.num_nodes == whole.num_nodes


@settings(max_examples=300, deadline=None)
@given(seqs=seqs_strategy, extra=st.lists(st.integers(0, 2), min_size=1, max_size=14),
       depth=st.integers(1, 6))
def test_removal_restores_the_previous_structure(seqs, extra, depth):
    tree = built(seqs, depth)
    before = tree.structure()
    tree.extend("extra", extra)
    tree.remove("extra")
    tree.check()
    assert tree.structure() == before


@settings(max_examples=300, deadline=None)
@given(seqs=seqs_strategy, depth=st.integers(1, 6), victim=st.integers(0, 3),
       more=st.lists(st.integers(0, 2), max_size=6))
def test_removing_any_sequence_leaves_the_tree_of_the_others(seqs, depth, victim, more):
    victim %= len(seqs)
    tree = built(seqs, depth)
    if not seqs[victim]:
        return
    tree.remove(victim)
    tree.check()  # among others: no node reads its tokens from the removed sequence
    others = {i: seq for i, seq in enumerate(seqs) if i != victim and seq}
    rebuilt = SuffixTree(depth)
    for i, seq in others.items():
        rebuilt.extend(i, seq)
    assert tree.structure() == rebuilt.structure()
    for i in others:  # the survivors keep growing correctly after the removal
        tree.extend(i, more)
        others[i] = others[i] + more
    tree.check()
    assert tree.path_counts() == brute_counts(list(others.values()), depth)


def test_fifo_removal_of_many_sequences_empties_the_tree():
    tree = SuffixTree(5)
    for i in range(20):
        tree.extend(i, [i % 3, 1, 2, i % 4, 1, 2, 0])
        if i >= 5:
            tree.remove(i - 5)
            tree.check()
    for i in range(15, 20):
        tree.remove(i)
    assert tree.num_nodes == 1 and tree.root.count == 0 and not tree.root.children


# --- speculation -----------------------------------------------------------------------------

RESPONSES = [[1, 2, 3, 4, 6], [1, 2, 3, 4, 7], [1, 2, 3, 5, 8]]


def test_path_mode_follows_the_most_frequent_continuation():
    tree = built(RESPONSES, depth=8)
    spec = tree.speculate([0, 1, 2, 3], max_spec_tokens=10, use_tree=False)
    # "1 2 3" continues with 4 twice and 5 once; after "4", 6 and 7 tie and the smaller id wins.
    assert spec.token_ids == [4, 6]
    assert spec.parents == [-1, 0]
    assert spec.probs == pytest.approx([2 / 3, 1 / 3])
    assert spec.score == pytest.approx(1.0)
    assert spec.match_len == 3  # m = 2 scores the same; ties go to the longer match


def test_min_token_prob_stops_the_path():
    tree = built(RESPONSES, depth=8)
    spec = tree.speculate([0, 1, 2, 3], max_spec_tokens=10, min_token_prob=0.5, use_tree=False)
    assert spec.token_ids == [4]  # 6 would have prob 1/3 < 0.5


def test_speculation_length_is_alpha_times_match_length():
    tree = built([[5, 6, 7, 8, 9, 10, 11, 12]], depth=16)
    for alpha, offset, expected in [(1.0, 0.0, 2), (0.5, 0.0, 1), (2.0, 0.0, 4), (1.0, 1.0, 3)]:
        spec = tree.speculate([5, 6, 7], max_spec_tokens=10, alpha=alpha, offset=offset, use_tree=False)
        assert spec.match_len == 2 and spec.token_ids == [8, 9, 10, 11][:expected]
    assert tree.speculate([5, 6, 7], max_spec_tokens=1).token_ids == [8]  # the hard cap
    assert tree.speculate([5, 6, 7], 10, alpha=0.4).token_ids == []  # floor(0.4 m) < 1 for m <= 2


def test_no_match_or_short_context_drafts_nothing():
    tree = built(RESPONSES, depth=8)
    assert tree.speculate([3], 10).token_ids == []  # m ranges over 1 .. len - 1
    assert tree.speculate([9, 9], 10).token_ids == []
    assert SuffixTree(8).speculate([1, 2, 3], 10).score == 0.0


def test_tree_mode_returns_best_first_nodes_with_valid_parents():
    tree = built(RESPONSES, depth=8)
    spec = tree.speculate([0, 1, 2, 3], max_spec_tokens=10, offset=1.0)
    # Budget 4 at m = 3. Best first: 4 (2/3); then 6, 7 and 5 (1/3 each).
    assert spec.match_len == 3
    assert spec.token_ids == [4, 6, 7, 5]
    assert spec.parents == [-1, 0, 0, -1]
    assert spec.probs == pytest.approx([2 / 3, 1 / 3, 1 / 3, 1 / 3])
    assert spec.probs == sorted(spec.probs, reverse=True)
    assert all(p < i for i, p in enumerate(spec.parents))


def test_context_is_cut_to_the_last_d_tokens():
    tree = built([[1, 2, 3, 4]], depth=3)
    spec = tree.speculate([9, 9, 9, 1, 2], max_spec_tokens=5, use_tree=False)
    assert spec.token_ids == [3] and spec.match_len == 2  # depth 3: "1 2" leaves one token


@settings(max_examples=600, deadline=None)
@given(seqs=seqs_strategy, context=st.lists(st.integers(0, 2), min_size=0, max_size=8),
       depth=st.integers(1, 6), max_spec=st.integers(0, 8), alpha=st.sampled_from([0.5, 1.0, 2.0]),
       offset=st.sampled_from([0.0, 1.0, -1.0]), min_prob=st.sampled_from([0.0, 0.1, 0.3]),
       use_tree=st.booleans(), own_tail=st.booleans())
def test_speculation_equals_brute_force_on_the_uncompressed_trie(seqs, context, depth, max_spec, alpha,
                                                                  offset, min_prob, use_tree, own_tail):
    if own_tail:  # as in decoding: the context ends with a stored sequence (the request itself)
        context = context + seqs[0]
    tree = built(seqs, depth)
    spec = tree.speculate(context, max_spec, alpha, offset, min_prob, use_tree)
    expected, match_len = brute_speculate(seqs, depth, context, max_spec, alpha, offset, min_prob, use_tree)
    assert list(zip(spec.token_ids, spec.parents)) == [(t, p) for t, p, _ in expected]
    assert spec.probs == pytest.approx([p for _, _, p in expected])
    assert spec.match_len == match_len
    assert all(p < i for i, p in enumerate(spec.parents))
    assert len(spec.token_ids) <= max_spec
