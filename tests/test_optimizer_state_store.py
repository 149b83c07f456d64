"""The sharded tables' optimizer slots between segments: files the ranks write and read (re-sharded from any number of
writers), checkpoints that name their folder, and a driver optimizer that never holds them."""

from __future__ import annotations

import gc
import json
import os

import keras
import numpy as np
import pytest

from sparktf.errors import ConfigurationError, StorageError
from sparktf.training.checkpoint import ModelState, checkpoint_path, load_checkpoint, write_checkpoint
from sparktf.training.tables.optimizer_state_store import (MANIFEST, optimizer_state_folder, optimizer_state_root,
                                                           prune_optimizer_state_folders, read_optimizer_state_rows,
                                                           write_manifest, write_optimizer_state_rows)
from sparktf.training.tables.plan import ShardedTable, ShardPlan
from sparktf.training.tables.update_form import TableUpdates

from test_shard_plan import recommender

ADAM = TableUpdates("dense", row_state=True)  # how an Adam updates tables, as the driver probes it


def test_optimizer_state_written_by_four_ranks_is_read_back_by_any_number_of_ranks_through_its_manifest(tmp_path):
    rng = np.random.default_rng(0)
    slots = {"momentum": rng.normal(size=(10, 3)).astype(np.float32), "velocity": rng.random((10, 3), np.float32)}
    folder = optimizer_state_folder(str(tmp_path), 7, b"launch")
    written = ShardedTable("users", "user", 10, (3,), 4)
    pieces = []
    for rank in range(4):  # 3, 3, 3 and 1 rows
        start, end = written.owned(rank)
        pieces.append(write_optimizer_state_rows(folder, "users", start, end,
                                                 {kind: rows[start:end] for kind, rows in slots.items()}))
    with pytest.raises(StorageError, match="has no manifest.json: .* the segment that wrote it did not finish"):
        read_optimizer_state_rows(folder, "users", 0, 10, ["momentum"])  # the ranks wrote, the manifest is not yet
    write_manifest(folder, 7, [piece for rank_pieces in pieces for piece in rank_pieces])
    with open(os.path.join(folder, MANIFEST)) as handle:
        assert json.load(handle)["iteration"] == 7
    for ranks in (1, 2, 3):
        table = ShardedTable("users", "user", 10, (3,), ranks)
        for rank in range(ranks):
            start, end = table.owned(rank)
            read = read_optimizer_state_rows(folder, "users", start, end, ["momentum", "velocity"])
            for kind, rows in slots.items():
                np.testing.assert_array_equal(read[kind], rows[start:end], err_msg=f"{ranks} ranks, rank {rank}")
    write_manifest(folder, 7, [piece for rank_pieces in pieces[:1] + pieces[2:] for piece in rank_pieces])  # rank 1's
    with pytest.raises(StorageError, match=r"optimizer variable 'momentum' of sharded table 'users' lacks rows \[3, 10\)"):
        read_optimizer_state_rows(folder, "users", 0, 10, ["momentum", "velocity"])


def test_only_the_current_folder_and_the_checkpoints_folders_are_kept(tmp_path):
    root = str(tmp_path)
    folders = {iteration: optimizer_state_folder(root, iteration, b"a") for iteration in (3, 5, 6, 9)}
    for folder in folders.values():
        write_optimizer_state_rows(folder, "users", 0, 1, {"momentum": np.zeros((1, 2), np.float32)})
    prune_optimizer_state_folders(root, keep_iterations=[3, 6], keep_folder=folders[9])
    assert sorted(os.listdir(root)) == sorted(os.path.basename(folders[i]) for i in (3, 6, 9))


def test_the_slots_folder_is_model_dir_or_a_temporary_one_on_a_local_master_only(tmp_path):
    assert optimizer_state_root(str(tmp_path), "spark://head:7077") == (os.path.join(str(tmp_path), "tables"), False)
    root, temporary = optimizer_state_root(None, "local-cluster[2,1,1024]")
    assert temporary and os.path.isdir(root)
    os.rmdir(root)
    with pytest.raises(ConfigurationError, match="pass TFOptimizer a model_dir that every executor can read"):
        optimizer_state_root(None, "spark://head:7077")


def test_a_checkpoint_names_its_slots_folder_relative_to_model_dir(tmp_path):
    model_dir = str(tmp_path / "run")
    folder = optimizer_state_folder(os.path.join(model_dir, "tables"), 4, b"a")
    state = ModelState([np.ones(2, np.float32)], [np.array(4)], 4, folder, ("users",))
    write_checkpoint(state, model_dir)
    os.rename(model_dir, tmp_path / "moved")  # a model_dir copied elsewhere keeps its checkpoints whole
    loaded = load_checkpoint(checkpoint_path(str(tmp_path / "moved"), 4))
    assert loaded.optimizer_state_folder == os.path.join(str(tmp_path / "moved"), "tables", os.path.basename(folder))
    assert loaded.optimizer_state_tables == ("users",)


def test_the_drivers_optimizer_has_no_slots_of_a_sharded_table_and_its_folder_goes_with_it(tmp_path):
    from sparktf.training.tables.strategy import ReplicatedTables, ShardedTables

    model = recommender()
    model.compile(keras.optimizers.Adam(), "mse")
    plan = ShardPlan.of(model, 2, None, {"users": True})
    root = str(tmp_path / "slots")
    os.mkdir(root)
    tables = ShardedTables(plan, ADAM, root, temporary=True)
    tables.build_optimizer(model)
    shapes = [tuple(v.shape) for v in model.optimizer.variables]
    assert (1001, 8) not in shapes and shapes.count((50, 4)) == 2  # Adam's two slots of the replicated table only
    assert tables.capture(model, 3, "f").optimizer_state_tables == ("users",)
    del tables
    gc.collect()
    assert not os.path.exists(root)  # the temporary folder is removed with its TFOptimizer's tables

    built = recommender()
    built.compile(keras.optimizers.Adam(), "mse")
    built.optimizer.build(built.trainable_variables)  # e.g. by fit
    with pytest.raises(ConfigurationError, match=r"built .* with optimizer state for the sharded tables \['users'\]"):
        ShardedTables(plan, ADAM, root).build_optimizer(built)


def test_an_optimizer_a_sharded_run_built_is_refused_by_a_replicated_one(tmp_path):
    from sparktf.training.tables.strategy import ReplicatedTables, ShardedTables

    model = recommender()
    model.compile(keras.optimizers.Adam(), "mse")
    ShardedTables(ShardPlan.of(model, 2, None, {"users": True}), ADAM, str(tmp_path)).build_optimizer(model)
    with pytest.raises(ConfigurationError, match=r"no optimizer state for \['users/embeddings'\] .* compile the model again"):
        ReplicatedTables(ShardPlan((), 2), ADAM).build_optimizer(model)
    ShardedTables(ShardPlan.of(model, 2, None, {"users": True}), ADAM, str(tmp_path)).build_optimizer(model)  # sharded again
