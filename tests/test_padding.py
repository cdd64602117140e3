"""rubric_jax/padding.py: bucket widths and left/right padding, hand-computed."""

import numpy as np
import pytest

from rubric_jax import padding


def test_length_buckets():
    assert padding.length_buckets(96, 1) == (128,)
    assert padding.length_buckets(128, 3) == (32, 64, 128)
    assert padding.length_buckets(20, 3) == (8, 16, 32)
    with pytest.raises(padding.PaddingError, match="length_buckets"):
        padding.length_buckets(64, 0)


def test_power_of_two_buckets_and_bucket_length():
    assert padding.power_of_two_buckets(16, 128) == (16, 32, 64, 128)
    assert padding.power_of_two_buckets(8, 8) == (8,)
    assert [padding.bucket_length(n, (16, 32, 64)) for n in (1, 16, 17, 64)] == [16, 16, 32, 64]
    with pytest.raises(padding.PaddingError, match="longer than the largest bucket 64"):
        padding.bucket_length(65, (16, 32, 64))
    with pytest.raises(padding.PaddingError, match="max_len must be a positive power of two"):
        padding.power_of_two_buckets(16, 96)


def test_pad_left_and_right_hand_computed():
    ids, mask = padding.pad_left([[5, 6, 7], [8]], pad_id=0, buckets=(2, 4, 8))
    np.testing.assert_array_equal(ids, [[0, 5, 6, 7], [0, 0, 0, 8]])
    np.testing.assert_array_equal(mask, [[0, 1, 1, 1], [0, 0, 0, 1]])
    assert ids.dtype == np.int32 and mask.dtype == bool
    ids, mask = padding.pad_right([[5, 6, 7], [8]], pad_id=9, buckets=(2, 4, 8))
    np.testing.assert_array_equal(ids, [[5, 6, 7, 9], [8, 9, 9, 9]])
    np.testing.assert_array_equal(mask, [[1, 1, 1, 0], [1, 0, 0, 0]])
    with pytest.raises(padding.PaddingError, match="sequence 1 of the batch: length 9"):
        padding.pad_left([[1], list(range(9))], 0, (4, 8))


def test_bucket_size_and_left_padded():
    assert [padding.bucket_size(n) for n in (1, 2, 3, 4, 5, 6, 7, 9, 13, 17, 100)] == [
        1, 2, 3, 4, 6, 6, 8, 12, 16, 24, 128]
    tokens, mask = padding.left_padded([[4, 5], [6], [7, 8, 9]], pad_id=0)
    np.testing.assert_array_equal(tokens, [[0, 4, 5], [0, 0, 6], [7, 8, 9]])
    np.testing.assert_array_equal(mask, tokens != 0)
    # An array comes with its mask: the pad id is a real token wherever the mask says so.
    ids = np.asarray([[0, 0, 4, 0], [0, 0, 0, 5]])
    given = np.asarray([[False, False, True, True], [False, True, True, True]])
    tokens, mask = padding.left_padded(ids, pad_id=0, prompt_mask=given)
    np.testing.assert_array_equal(tokens, ids)
    np.testing.assert_array_equal(mask, given)
    with pytest.raises(ValueError, match="pass its prompt_mask"):
        padding.left_padded(ids, pad_id=0)
    with pytest.raises(ValueError, match=r"rows \[0\] are not left-padded"):
        padding.left_padded(ids, pad_id=0, prompt_mask=np.asarray([[True, False, True, True], [True] * 4]))
    with pytest.raises(ValueError, match="rows \\[1\\] are empty"):
        padding.left_padded([[1], []], pad_id=0)
