"""The prompt-lookup drafter (sd_lookup_draft through _core.lookup_draft) against a Python
statement of its rule: the longest n-gram that occurs earlier; among its occurrences the one
whose preceding tokens agree longest with the text's end (the latest among equals); the tokens
that followed it, continued periodically past the end of the text."""

from __future__ import annotations

import numpy as np
import pytest

from specdec import _core

EXTENT_MAX = 64  # SD_LOOKUP_EXTENT_MAX


def reference_draft(h, k, max_ngram, min_ngram):
    L = len(h)
    for n in range(max_ngram, min_ngram - 1, -1):
        if n >= L:
            continue
        best, best_e = None, 0
        for i in range(L - n - 1, -1, -1):
            if h[i:i + n] != h[L - n:]:
                continue
            e = n
            while e < EXTENT_MAX and i + n - e - 1 >= 0 and h[i + n - e - 1] == h[L - e - 1]:
                e += 1
            if e > best_e:
                best, best_e = i, e
        if best is not None:
            src = list(h)
            for j in range(k):  # what followed, the draft itself once past the end
                src.append(src[best + n + j])
            return src[L:], n, best_e
    return [], 0, 0


def test_a_period_shorter_than_k_is_drafted_k_tokens_ahead():
    h = [7, 1, 2, 3, 1, 2, 3, 1, 2]
    assert _core.lookup_draft(h, 8, 3, 1) == ([3, 1, 2, 3, 1, 2, 3, 1], 3, 5)
    # a token repeated: one token of history gives a whole draft
    assert _core.lookup_draft([5, 9, 9], 4, 2, 1) == ([9, 9, 9, 9], 1, 1)


def test_the_occurrence_with_the_longest_agreement_wins_over_the_latest():
    # "4 1 2" occurs twice; the earlier occurrence is preceded by "8 9" as the end is
    h = [8, 9, 4, 1, 2, 5, 6, 0, 4, 1, 2, 7, 7, 8, 9, 4, 1, 2]
    assert _core.lookup_draft(h, 3, 3, 1) == ([5, 6, 0], 3, 5)
    # equal agreement: the latest
    h = [3, 4, 1, 2, 5, 3, 4, 1, 2, 6, 0, 4, 1, 2]
    assert _core.lookup_draft(h, 2, 3, 1) == ([6, 0], 3, 3)


def test_the_longest_ngram_decides_and_no_match_gives_nothing():
    h = [1, 2, 3, 9, 3, 5, 2, 3]
    assert _core.lookup_draft(h, 2, 2, 1) == ([9, 3], 2, 2)  # "2 3", not the later "3"
    assert _core.lookup_draft([1, 2, 3, 4], 4, 3, 1) == ([], 0, 0)
    assert _core.lookup_draft([1, 2, 1, 2], 4, 3, 2) == ([1, 2, 1, 2], 2, 2)
    assert _core.lookup_draft([1, 2, 1, 2], 4, 3, 3) == ([], 0, 0)  # "2 1 2" never occurred before
    assert _core.lookup_draft([], 4, 3, 1) == ([], 0, 0)


@pytest.mark.parametrize("vocab", [2, 4, 30])
def test_random_texts_match_the_reference(vocab):
    rng = np.random.default_rng(vocab)
    for trial in range(300):
        L = int(rng.integers(1, 160))
        h = [int(x) for x in rng.integers(0, vocab, size=L)]
        if trial % 3 == 0:  # a loop at the end, as small models fall into
            p = int(rng.integers(1, 12))
            h += (h[-p:] * (200 // p + 1))[:int(rng.integers(0, 100))]
        k = int(rng.integers(1, 33))
        lo = int(rng.integers(1, 4))
        hi = lo + int(rng.integers(0, 4))
        assert _core.lookup_draft(h, k, hi, lo) == reference_draft(h, k, hi, lo), (h, k, hi, lo)


@pytest.mark.parametrize("args,match", [((0, 3, 1), "k"), ((33, 3, 1), "k"),
                                        ((4, 1, 2), "min_ngram"), ((4, 3, 0), "min_ngram")])
def test_bad_arguments_are_refused(args, match):
    with pytest.raises(ValueError, match=match):
        _core.lookup_draft([1, 2, 1], *args)
