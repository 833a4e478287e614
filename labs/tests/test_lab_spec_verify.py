"""Lab spec_verify: greedy verification of draft tokens."""

import pytest

from engine.spec_decode.rejection_sampler import verify_greedy


@pytest.mark.parametrize("drafts, target, expected", [
    ([5, 6, 7], [5, 6, 7, 8], (3, [5, 6, 7, 8])),
    ([5, 6, 7], [5, 9, 7, 8], (1, [5, 9])),
    ([5, 6, 7], [4, 6, 7, 8], (0, [4])),
    ([], [3], (0, [3])),
])
def test_the_longest_agreeing_prefix_then_the_target_token(drafts, target, expected):
    assert verify_greedy(drafts, target) == expected, \
        "accept drafts while they equal the target's argmax; then the target's own token (the bonus after all k)"


def test_a_wrong_number_of_target_tokens_is_an_error():
    with pytest.raises(ValueError):
        verify_greedy([1, 2], [1, 2])
