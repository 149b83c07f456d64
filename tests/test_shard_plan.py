"""training.tables.plan: which tables are sharded and which rows each rank owns, from the model alone."""

import logging

import keras
import numpy as np
import pytest

from sparktf.errors import ConfigurationError
from sparktf.training.tables.plan import ShardPlan


def recommender():
    users, items = keras.Input((1,), dtype="int64", name="user"), keras.Input((2,), dtype="int64", name="item")
    numbers = keras.Input((3,), name="numbers")
    looked_up = [keras.layers.Flatten()(keras.layers.Embedding(1001, 8, name="users")(users)),
                 keras.layers.Flatten()(keras.layers.Embedding(50, 4, name="items")(items))]
    bucket = keras.layers.Embedding(7, 2, name="buckets")(keras.ops.cast(numbers[:, :1], "int32"))
    joined = keras.layers.Concatenate()(looked_up + [keras.layers.Flatten()(bucket), numbers])
    return keras.Model([users, items, numbers], keras.layers.Dense(1)(joined))


def test_tables_over_the_threshold_are_sharded_in_contiguous_row_ranges():
    plan = ShardPlan.of(recommender(), 3, threshold_bytes=1000)
    assert [(t.layer, t.input_name, t.rows, t.row_shape) for t in plan.tables] == [("users", "user", 1001, (8,))]
    users = plan.tables[0]
    assert users.rows_per_rank == 334 and [users.owned(r) for r in range(3)] == [(0, 334), (334, 668), (668, 1001)]
    assert users.owners(np.array([0, 333, 334, 1000])).tolist() == [0, 0, 1, 2]
    alone = ShardPlan.of(recommender(), 1, threshold_bytes=0).tables  # one worker holds it whole, slots in files
    assert alone[0].layer == "users" and alone[0].owned(0) == (0, 1001)


def test_a_launch_on_another_worker_count_splits_the_same_tables_anew():
    plan = ShardPlan.of(recommender(), 4, None, {"users": True, "items": True})
    assert [(t.layer, t.ids_per_record) for t in plan.tables] == [("users", 1), ("items", 2)]
    assert plan.capacities(16) == {"users": 16, "items": 32}  # a working table holds a local batch's ids
    fewer = plan.on(3)  # an elastic relaunch after a worker was lost
    assert [t.layer for t in fewer.tables] == ["users", "items"] and fewer.tables[0].owned(2) == (668, 1001)
    assert plan.on(1).tables[1].owned(0) == (0, 50)  # one worker left holds the tables whole


def test_a_choice_overrides_the_threshold_both_ways_and_names_what_cannot_be_sharded(caplog):
    plan = ShardPlan.of(recommender(), 2, threshold_bytes=1000, choices={"users": False, "items": True})
    assert [t.layer for t in plan.tables] == ["items"]
    with pytest.raises(ConfigurationError, match=r"\['nope'\] are not Embedding layers .* \['buckets', 'items', 'users'\]"):
        ShardPlan.of(recommender(), 2, None, {"nope": True})
    with pytest.raises(ConfigurationError, match="'buckets' cannot be sharded: its ids are not a model input"):
        ShardPlan.of(recommender(), 2, None, {"buckets": True})
    frozen = recommender()
    frozen.get_layer("users").trainable = False
    assert [t.layer for t in ShardPlan.of(frozen, 2, threshold_bytes=1000).tables] == []
    with pytest.raises(ConfigurationError, match=r"'users' cannot be sharded: it is frozen \(trainable=False\)"):
        ShardPlan.of(frozen, 2, None, {"users": True})
    with caplog.at_level(logging.INFO, "sparktf.training"):  # picked by the threshold alone: replicated, said
        assert [t.layer for t in ShardPlan.of(recommender(), 2, threshold_bytes=0).tables] == ["users", "items"]
    assert "'buckets'" in caplog.text and "stays replicated" in caplog.text
    assert "'users' (32032 bytes) is sharded across 2 workers: each holds 501 of its 1001 rows" in caplog.text


def shared_ids(raw_reader=False):
    """Two tables on one input (Wide & Deep); three on columns of another (DLRM), one of them small."""
    ids, cats = keras.Input((3,), dtype="int64", name="ids"), keras.Input((4,), dtype="int32", name="cats")
    parts = [keras.layers.Flatten()(keras.layers.Embedding(1000, 8, name="deep")(ids)),
             keras.layers.Flatten()(keras.layers.Embedding(1000, 1, name="wide")(ids)),
             keras.layers.Embedding(1000, 4, name="c0")(cats[:, 0]),
             keras.layers.Embedding(1000, 4, name="c3")(cats[:, -1]),
             keras.layers.Embedding(5, 2, name="c1")(cats[:, 1])]
    if raw_reader:
        parts.append(keras.layers.Dense(2, name="raw")(keras.ops.cast(cats, "float32")))
    return keras.Model([ids, cats], keras.layers.Dense(1)(keras.layers.Concatenate()(parts)))


def test_tables_looked_up_by_the_same_ids_are_sharded_together_and_columns_of_an_input_alone(caplog):
    plan = ShardPlan.of(shared_ids(), 2, None, {"deep": True, "wide": True, "c0": True, "c3": True})
    assert [(t.layer, t.input_name, t.column, t.ids_per_record) for t in plan.tables] == [
        ("deep", "ids", None, 3), ("wide", "ids", None, 3), ("c0", "cats", 0, 1), ("c3", "cats", 3, 1)]
    with pytest.raises(ConfigurationError, match=r"'deep' cannot be sharded: its ids \(model input 'ids'\) are also "
                                                 r"read by 'wide', which would see their positions"):
        ShardPlan.of(shared_ids(), 2, None, {"deep": True})
    with caplog.at_level(logging.WARNING, "sparktf.training"):  # the size picks deep, not wide: both replicated
        assert [t.layer for t in ShardPlan.of(shared_ids(), 2, threshold_bytes=10_000).tables] == ["c0", "c3"]
    assert "'deep' (32000 bytes) stays replicated" in caplog.text and "also read by 'wide'" in caplog.text
    with pytest.raises(ConfigurationError, match=r"'c0' cannot be sharded: its ids \(model input 'cats'\[:, 0\]\) "
                                                 r"are also read by 'cast"):
        ShardPlan.of(shared_ids(raw_reader=True), 2, None, {"c0": True})
