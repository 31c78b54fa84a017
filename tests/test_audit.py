"""Audit comparison on hand-built outputs (the real-model audit runs in test_bench/test_decode)."""

from oilbird.audit import Reference, compare

REF = Reference(output_ids=[5, 6, 7, 8], margins=[3.0, 0.01, 2.5, 1.0], wall_s=0.0)


def test_identical_output_is_lossless():
    assert compare([5, 6, 7, 8], REF).lossless


def test_first_divergence_reports_position_tokens_and_margin():
    audit = compare([5, 9, 7, 8], REF)
    assert not audit.lossless
    assert (audit.divergence, audit.expected, audit.got, audit.margin) == (1, 6, 9, 0.01)


def test_shorter_or_longer_output_diverges_where_one_ends():
    short = compare([5, 6], REF)
    assert (short.divergence, short.expected, short.got) == (2, 7, None)
    long = compare([5, 6, 7, 8, 2], REF)
    assert (long.divergence, long.expected, long.got, long.margin) == (4, None, 2, None)


def test_differences_count_what_a_lossy_output_changed():
    from oilbird.audit import differences

    assert differences([1, 2, 3], [1, 2, 3]).tokens == 0 and differences([1, 2, 3], [1, 2, 3]).first is None
    d = differences([1, 9, 3, 4], [1, 2, 3])
    assert (d.tokens, d.first) == (2, 1)
    assert differences([1, 2], [1, 2, 3]).first == 2
