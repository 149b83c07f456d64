"""What the examples share: common flags, the Spark session, training with summaries and checkpoints.

Each example is a script with a ``main(argv)`` that returns its results, so it
runs as ``python examples/X.py``, as ``spark-submit examples/X.py`` and from a
test or a notebook that calls ``main([...])`` in a running session.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Dict, List, Optional, Sequence

import keras
import numpy as np
from pyspark import SparkContext
from pyspark.sql import SparkSession

import sparktf
from sparktf import EveryEpoch, MaxEpoch, TFDataset, TFOptimizer, TrainSummary, ValidationSummary, storage

#: Modules of this folder the executors import (Spark ships them like ``--py-files``).
HELPER_MODULES = ("example_support.py", "image_augmentation.py", "cifar10_data.py", "imagenet_records.py")


def example_parser(description: str) -> argparse.ArgumentParser:
    """An argument parser with the flags every example has: ``--master``, ``--num_workers``, ``--smoke``."""
    parser = argparse.ArgumentParser(description=description,
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--master", default=None,
                        help="Spark master URL; default: spark-submit's --master, $MASTER, or local[*]")
    parser.add_argument("--num_workers", type=int, default=None,
                        help="training tasks (one Spark task slot each); default: the default parallelism")
    parser.add_argument("--smoke", action="store_true",
                        help="a run of a few seconds on tiny generated data (what the tests run)")
    return parser


def start_spark(args: argparse.Namespace, app_name: str) -> SparkSession:
    """The session the example runs in (``sparktf.init_spark``), with this folder's helpers on the executors.

    An unset ``args.num_workers`` becomes Spark's default parallelism.
    """
    spark = sparktf.init_spark(master=args.master, app_name=app_name,
                               conf={"spark.ui.showConsoleProgress": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    ship_helpers(spark.sparkContext)
    args.num_workers = args.num_workers or spark.sparkContext.defaultParallelism
    return spark


def ship_helpers(sc: SparkContext) -> None:
    """Add this folder's helper modules to the executors' Python path (once per SparkContext)."""
    here = os.path.dirname(os.path.abspath(__file__))
    shipped = {os.path.basename(path) for path in sc.listFiles}
    for name in HELPER_MODULES:
        if name not in shipped:
            sc.addPyFile(os.path.join(here, name))


def global_batch(requested: int, num_workers: int) -> int:
    """``requested`` rounded down to a multiple of ``num_workers`` (at least one record per worker)."""
    return max(requested - requested % num_workers, num_workers)


def add_training_flags(parser: argparse.ArgumentParser, standard_epochs: int) -> None:
    """``--train_epochs`` (default: the recipe's ``standard_epochs``) and ``--model_dir``."""
    parser.add_argument("--train_epochs", type=int, default=standard_epochs)
    parser.add_argument("--model_dir", default=None,
                        help="checkpoints and TensorBoard logs; resumes from its latest checkpoint")


def compile_with_step_decay(model: keras.Model, base_rate: float, decay_epochs: Sequence[int],
                            standard_epochs: int, train_epochs: int, iterations_per_epoch: int) -> None:
    """Compile for classification with SGD (momentum 0.9) on a step-decay learning rate.

    The rate is ``base_rate``, divided by 10 at each of ``decay_epochs``:
    epochs of the recipe's ``standard_epochs``-epoch run, scaled to
    ``train_epochs`` (a 2-epoch run of the 182-epoch CIFAR recipe decays at
    the same fractions of training).
    """
    boundaries = [max(1, round(epoch / standard_epochs * train_epochs * iterations_per_epoch))
                  for epoch in decay_epochs]
    rates = [base_rate / 10 ** step for step in range(len(boundaries) + 1)]
    schedule = keras.optimizers.schedules.PiecewiseConstantDecay(boundaries, rates)
    model.compile(optimizer=keras.optimizers.SGD(schedule, momentum=0.9),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])


def has_checkpoint(model_dir: str) -> bool:
    """True when ``model_dir`` (a local folder or a URI) holds a sparktf checkpoint (``checkpoint-<iteration>.npz``)."""
    return bool(storage.store_for(model_dir, "--model_dir").glob(storage.join(model_dir, "checkpoint-*.npz")))


def train_and_validate(
    model: keras.Model,
    dataset: TFDataset,
    model_dir: Optional[str],
    app_name: str,
    train_epochs: int,
    num_workers: Optional[int] = None,
    validation: Optional[TFDataset] = None,
) -> Dict[str, float]:
    """Train ``model`` with summaries and a checkpoint every epoch, resuming from ``model_dir``.

    Progress is Keras-style (a bar per epoch in a terminal, a line per epoch
    otherwise); the last line is ``accuracy=... images/s=...`` (the images/s of the training steps, from
    the ``Throughput`` summary, as in the seeds' tables).

    Parameters
    ----------
    model : keras.Model
        A compiled model whose first metric is ``accuracy``.
    dataset : TFDataset
        Training data with a global ``batch_size``; its validation data, if
        any, is validated every epoch.
    model_dir : str or None
        Checkpoints go here; TensorBoard logs go to ``model_dir/logs``
        (``None``: a fresh temporary directory).
    app_name : str
        The summaries' application name.
    train_epochs : int
        The epoch training ends after (counted across resumes).
    num_workers : int, optional
        Training tasks; default: Spark's default parallelism.
    validation : TFDataset, optional
        Validation data of its own (e.g. another preprocessing than
        ``dataset``'s), evaluated once after training for the accuracy;
        default: ``dataset``'s validation data.

    Returns
    -------
    dict
        ``accuracy``, ``images_per_sec``, ``iterations``, ``epochs``,
        ``resumed_from`` (the iteration of the checkpoint loaded, 0 if none).
    """
    model_dir = model_dir or tempfile.mkdtemp(prefix=f"sparktf-{app_name}-")
    optimizer = TFOptimizer.from_keras(model, dataset, model_dir=model_dir, num_workers=num_workers)
    log_dir = storage.join(model_dir, "logs")
    train_summary = TrainSummary(log_dir, app_name)
    optimizer.set_train_summary(train_summary)
    optimizer.set_val_summary(ValidationSummary(log_dir, app_name))
    resumed_from = 0
    if has_checkpoint(model_dir):
        optimizer.load_checkpoint()
        resumed_from = optimizer.iteration
        print(f"resumed from the checkpoint of iteration {resumed_from} in {model_dir}")
    started = time.perf_counter()
    history = optimizer.optimize(end_trigger=MaxEpoch(train_epochs), checkpoint_trigger=EveryEpoch())
    seconds = time.perf_counter() - started
    accuracies: List[float] = history.get("val_accuracy", [])
    if validation is None and accuracies:
        accuracy = accuracies[-1]
    else:
        accuracy = float(optimizer.evaluate(dataset.val_dataset if validation is None else validation)["accuracy"])
    images_per_sec = steady_throughput(train_summary)
    trained = history["iterations"] - resumed_from
    print(f"trained {trained} iterations in {seconds:.1f} s (Spark jobs included); "
          f"checkpoints and TensorBoard logs in {model_dir}")
    print(f"accuracy={accuracy:.4f} images/s={images_per_sec:.1f}")
    return {"accuracy": float(accuracy), "images_per_sec": images_per_sec,
            "iterations": history["iterations"], "epochs": history["epochs"], "resumed_from": resumed_from}


def steady_throughput(summary: TrainSummary) -> float:
    """Median records/s of the training steps written to ``summary`` (0.0 when none were)."""
    rows = summary.read_scalar("Throughput")
    return float(np.median(rows[:, 1])) if len(rows) else 0.0

