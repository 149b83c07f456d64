"""Hashing of int64 ids and the count-min sketch that counts the sightings of ids not yet admitted.

Everything here is stock TensorFlow ops (bit operations on ``uint64``), so
it runs inside ``tf.function``, on every rank alike, and in an exported
SavedModel.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

__all__ = ["SKETCH_DEPTH", "bucket", "sketch_add", "sketch_estimate", "sketch_width"]

SKETCH_DEPTH = 4  # rows of the count-min sketch: an over-count beyond its bound has probability e**-4 < 2%
FALLBACK_SALT = 0x2545F4914F6CDD1D  # the salt of the fallback table's hash (the sketch's rows use 1..depth)
_GOLDEN = 0x9E3779B97F4A7C15


def _mix64(keys: tf.Tensor) -> tf.Tensor:
    """SplitMix64's finalizer of int64 ``keys``, as ``uint64``: every output bit depends on every input bit, so
    consecutive ids spread evenly over buckets."""
    bits = tf.bitcast(keys, tf.uint64)
    for shift, factor in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
        bits = tf.bitwise.bitwise_xor(bits, tf.bitwise.right_shift(bits, tf.constant(shift, tf.uint64)))
        bits = bits * tf.constant(factor, tf.uint64)
    return tf.bitwise.bitwise_xor(bits, tf.bitwise.right_shift(bits, tf.constant(31, tf.uint64)))


def bucket(keys: tf.Tensor, salt: int, buckets: int) -> tf.Tensor:
    """The bucket in ``[0, buckets)`` (int32) of each int64 key, for the hash function numbered ``salt``.

    Parameters
    ----------
    keys : tf.Tensor
        int64 ids, any shape.
    salt : int
        Picks one of a family of independent hash functions (any int below 2**64).
    buckets : int
        The number of buckets.

    Returns
    -------
    tf.Tensor
        int32, the shape of ``keys``.
    """
    salted = tf.bitwise.bitwise_xor(tf.bitcast(keys, tf.uint64), tf.constant((salt * _GOLDEN) % 2 ** 64, tf.uint64))
    mixed = _mix64(tf.bitcast(salted, tf.int64))
    return tf.cast(tf.math.floormod(mixed, tf.constant(buckets, tf.uint64)), tf.int32)


def sketch_width(capacity: int) -> int:
    """The width of the sketch of a table of ``capacity`` rows: the power of two ``>= max(1024, 8 * capacity)``."""
    width = 1024
    while width < 8 * capacity:
        width *= 2
    return width


def _cells(keys: tf.Tensor, width: int) -> tf.Tensor:
    """The ``[depth * len(keys), 2]`` (row, column) cells of the sketch that the 1-D ``keys`` hash to."""
    columns = tf.concat([bucket(keys, salt, width) for salt in range(1, SKETCH_DEPTH + 1)], axis=0)
    rows = tf.repeat(tf.range(SKETCH_DEPTH, dtype=tf.int32), tf.size(keys))
    return tf.stack([rows, columns], axis=1)


def sketch_add(sketch: Any, keys: tf.Tensor, counts: tf.Tensor) -> None:
    """Add ``counts`` (int32) sightings of the 1-D int64 ``keys`` to the ``[depth, width]`` int32 ``sketch``
    (a ``tf.Variable``)."""
    sketch.scatter_nd_add(_cells(keys, int(sketch.shape[1])), tf.tile(counts, [SKETCH_DEPTH]))


def sketch_estimate(sketch: Any, keys: tf.Tensor) -> tf.Tensor:
    """The estimated sightings (int32) of the 1-D int64 ``keys``: the least of their ``depth`` counters (never an
    under-count)."""
    counters = tf.gather_nd(sketch, _cells(keys, int(sketch.shape[1])))
    return tf.reduce_min(tf.reshape(counters, [SKETCH_DEPTH, -1]), axis=0)
