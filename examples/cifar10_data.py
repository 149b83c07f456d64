"""The CIFAR-10 binary format (``cifar-10-batches-bin``): read into Spark, write for tests.

Each record is 3073 bytes: one label byte (0-9), then the 32x32x3 image as
1024 red, 1024 green and 1024 blue bytes (channels first, rows top to
bottom). Training data is ``data_batch_1.bin`` ... ``data_batch_5.bin``
(10000 records each), test data ``test_batch.bin``.
"""

from __future__ import annotations

import os
from typing import List, Tuple

import numpy as np
from pyspark import RDD, SparkContext

from sparktf import storage

HEIGHT = WIDTH = 32
CHANNELS = 3
IMAGE_BYTES = HEIGHT * WIDTH * CHANNELS
RECORD_BYTES = 1 + IMAGE_BYTES
NUM_CLASSES = 10
TRAIN_FILES = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
TEST_FILES = ("test_batch.bin",)
#: The synthetic classes' colours are the same in every file.
PALETTE_SEED = 10


def split_files(data_dir: str, train: bool) -> List[str]:
    """The paths of the training (or test) files in ``data_dir``.

    Raises
    ------
    FileNotFoundError
        Naming the first missing file (``data_dir`` must be the
        ``cifar-10-batches-bin`` folder).
    """
    paths = [storage.join(data_dir, name) for name in (TRAIN_FILES if train else TEST_FILES)]
    for path in paths:  # a local folder or a URI (hdfs://, s3a://, ...): Spark reads them through Hadoop
        if not storage.store_for(path, "--data_dir file").exists(path):
            raise FileNotFoundError(f"{path} is missing: --data_dir must be the cifar-10-batches-bin folder")
    return paths


def parse_record(record: bytes) -> Tuple[np.ndarray, int]:
    """One 3073-byte record -> ``(uint8 image of shape (32, 32, 3), label)``."""
    raw = np.frombuffer(record, dtype=np.uint8)
    if raw.size != RECORD_BYTES:
        raise ValueError(f"a CIFAR-10 record has {RECORD_BYTES} bytes, got {raw.size}")
    image = raw[1:].reshape(CHANNELS, HEIGHT, WIDTH).transpose(1, 2, 0)
    return image, int(raw[0])


def read_rdd(sc: SparkContext, data_dir: str, train: bool) -> RDD:
    """An RDD of ``(image, label)`` records from the split's files (read on the executors)."""
    paths = split_files(data_dir, train)
    return sc.binaryRecords(",".join(paths), RECORD_BYTES).map(parse_record)


def write_batch(path: str, images: np.ndarray, labels: np.ndarray) -> None:
    """Write ``images`` (N, 32, 32, 3) uint8 and ``labels`` (N,) as one CIFAR-10 binary file."""
    channels_first = np.ascontiguousarray(images.astype(np.uint8).transpose(0, 3, 1, 2)).reshape(len(images), -1)
    records = np.concatenate([labels.astype(np.uint8).reshape(-1, 1), channels_first], axis=1)
    with open(path, "wb") as handle:
        handle.write(records.tobytes())


def synthetic_arrays(num_records: int, seed: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    """Random learnable images: each class is a distinct mean colour plus noise."""
    palette = np.random.default_rng(PALETTE_SEED).integers(40, 216, size=(NUM_CLASSES, 1, 1, CHANNELS))
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, NUM_CLASSES, size=num_records)
    noise = rng.normal(0, 24, size=(num_records, HEIGHT, WIDTH, CHANNELS))
    images = np.clip(palette[labels] + noise, 0, 255).astype(np.uint8)
    return images, labels.astype(np.int32)


def write_synthetic_dir(data_dir: str, records_per_file: int, seed: int = 0) -> str:
    """A ``cifar-10-batches-bin``-style folder of synthetic records; returns ``data_dir``."""
    os.makedirs(data_dir, exist_ok=True)
    for offset, name in enumerate(TRAIN_FILES + TEST_FILES):
        images, labels = synthetic_arrays(records_per_file, seed=seed + offset)
        write_batch(os.path.join(data_dir, name), images, labels)
    return data_dir
