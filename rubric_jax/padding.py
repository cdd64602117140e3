"""The one place where batches get their padded shapes: bucket widths and left/right padding of token rows.

Every padded width is the smallest of a set of buckets that holds the longest row, so a jitted program
compiles once per bucket, not once per length. Two bucket sets are in use: the configured power-of-two widths
of the trainer's batches (`length_buckets`, config.data.length_buckets) and, where nothing is configured, the
sampler's series 1, 2, 3, 4, 6, 8, 12, ... (`bucket_size`: batch rows, stop ids, response slots of a plain
`sampling.generate`). A rollout pads its prompts once (`pad_left`, to a prompt bucket the sampler decodes
in place) and its responses once (the sampler's response slots, of the rollout's largest response bucket;
the training batch is a column prefix of them).

Shape legend: B rows, T padded width.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rubric_jax import distributed


class PaddingError(ValueError):
    """A batch that does not fit its buckets, or buckets that cannot be built (the message says which)."""


def bucket_size(n: int) -> int:
    """Smallest bucket >= n among 1, 2, 3, 4, 6, 8, 12, 16, 24, ... (powers of two and 1.5x them)."""
    if n < 1:
        raise PaddingError(f"bucket_size needs n >= 1, got {n}")
    power = 1
    while True:
        if n <= power:
            return power
        if power >= 2 and n <= power * 3 // 2:
            return power * 3 // 2
        power *= 2


def power_of_two_buckets(min_len: int, max_len: int) -> tuple[int, ...]:
    """(min_len, 2·min_len, …, max_len): both ends must be powers of two."""
    for name, v in (("min_len", min_len), ("max_len", max_len)):
        if v <= 0 or v & (v - 1):
            raise PaddingError(f"{name} must be a positive power of two, got {v}")
    if min_len > max_len:
        raise PaddingError(f"min_len {min_len} > max_len {max_len}")
    buckets = [min_len]
    while buckets[-1] < max_len:
        buckets.append(buckets[-1] * 2)
    return tuple(buckets)


def length_buckets(max_len: int, count: int) -> tuple[int, ...]:
    """The padding widths of every batch the trainer builds (prompts, SFT responses, rollouts): `count`
    power-of-two widths ending at the first power of two >= max_len (each width compiles a step function
    once more; 1 bucket = always pad to the maximum)."""
    if count < 1:
        raise PaddingError(f"length_buckets: count must be >= 1, got {count}")
    top = 1 << (max(max_len, 1) - 1).bit_length()
    return power_of_two_buckets(max(top >> (count - 1), min(8, top)), top)


def bucket_length(length: int, buckets: Sequence[int]) -> int:
    """The smallest bucket that holds `length` tokens."""
    for b in sorted(buckets):
        if length <= b:
            return b
    raise PaddingError(f"length {length} is longer than the largest bucket {max(buckets)}")


def _pad(seqs: Sequence[Sequence[int]], pad_id: int, buckets: Sequence[int] | None, left: bool,
         across_processes: bool) -> tuple[np.ndarray, np.ndarray]:
    """Pads every sequence to the bucket of the longest one (no `buckets`: to the longest itself; with
    `across_processes`, the longest of every process's batch: each process must call it)."""
    if not seqs:
        raise PaddingError("cannot pad an empty batch")
    longest = max(len(s) for s in seqs)
    if across_processes:
        (longest,) = distributed.max_over_processes(longest)
    try:
        width = longest if buckets is None else bucket_length(longest, buckets)
    except PaddingError as e:
        row = max(range(len(seqs)), key=lambda i: len(seqs[i]))
        raise PaddingError(f"sequence {row} of the batch: {e}") from e
    ids = np.full((len(seqs), width), pad_id, dtype=np.int32)
    mask = np.zeros((len(seqs), width), dtype=bool)
    for i, s in enumerate(seqs):
        cols = slice(width - len(s), width) if left else slice(0, len(s))
        ids[i, cols] = s
        mask[i, cols] = True
    return ids, mask


def pad_left(seqs: Sequence[Sequence[int]], pad_id: int, buckets: Sequence[int] | None = None, *,
             across_processes: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Left-pads to the bucket of the longest sequence (no `buckets`: to its length): (ids_BxT int32,
    mask_BxT bool, True = token)."""
    return _pad(seqs, pad_id, buckets, left=True, across_processes=across_processes)


def pad_right(seqs: Sequence[Sequence[int]], pad_id: int, buckets: Sequence[int] | None = None, *,
              across_processes: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Right-pads to the bucket of the longest sequence (no `buckets`: to its length): (ids_BxT int32,
    mask_BxT bool, True = token)."""
    return _pad(seqs, pad_id, buckets, left=False, across_processes=across_processes)


def left_padded(prompt_ids: Sequence[Sequence[int]] | np.ndarray, pad_id: int,
                prompt_mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Prompts as left-padded int32 [B, T] tokens and a bool mask (True = real token), every row non-empty.

    Either ragged rows (a list of lists, no mask: padded to the longest), or a 2-D array with its
    `prompt_mask` [B, T] whose real tokens form one block ending at the last column per row (used as it is).
    The mask is never guessed from `pad_id`: a prompt may contain the pad id as a real token.
    """
    if prompt_mask is None and isinstance(prompt_ids, np.ndarray):
        raise PaddingError("prompt_ids is an array: pass its prompt_mask too (padding is never guessed from pad_id)")
    if prompt_mask is None:
        if len(prompt_ids) == 0:
            raise PaddingError("prompt_ids is empty: need at least one prompt")
        tokens, mask = pad_left([list(map(int, row)) for row in prompt_ids], pad_id)
    else:
        tokens, mask = np.asarray(prompt_ids).astype(np.int32), np.asarray(prompt_mask)
        if tokens.ndim != 2 or mask.shape != tokens.shape or mask.dtype != np.bool_:
            raise PaddingError(f"prompt_ids {tokens.shape} and prompt_mask {mask.shape} {mask.dtype} must be "
                               "2-D [batch, length] of the same shape, the mask boolean")
        not_left_padded = np.flatnonzero((mask[:, :-1] & ~mask[:, 1:]).any(axis=1))
        if not_left_padded.size:
            raise PaddingError(f"prompt_mask rows {not_left_padded[:8].tolist()} are not left-padded (real tokens "
                               "must form one block ending at the last column)")
    if tokens.shape[0] == 0:
        raise PaddingError("prompt_ids is empty: need at least one prompt")
    empty = np.flatnonzero(~mask.any(axis=1))
    if empty.size:
        raise PaddingError(f"prompt_ids rows {empty[:8].tolist()} are empty (only padding)")
    return tokens, mask
