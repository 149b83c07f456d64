"""Write ImageNet-style TFRecord files of random JPEG images, for trying ``imagenet_resnet.py`` without ImageNet.

    python examples/make_synthetic_imagenet.py --out_dir /tmp/imagenet-synthetic
    python examples/imagenet_resnet.py --data_dir /tmp/imagenet-synthetic --image_size 64

The records have the layout of the real TFRecords (``image/encoded`` JPEG,
``image/class/label`` 1-based, ...). Each class is a colour plus noise, so
the images are learnable.
"""

from __future__ import annotations

import argparse
import os
from typing import Optional, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import sparktf  # noqa: F401 - before TensorFlow: keeps its start-up log lines out of the output

import numpy as np
import tensorflow as tf

from imagenet_records import encode_example


def write_split(path: str, num_records: int, num_classes: int, image_size: int, seed: int) -> None:
    """One TFRecord file of ``num_records`` random JPEGs of ``image_size`` x ``image_size``."""
    palette = np.random.default_rng(0).integers(30, 226, size=(num_classes, 1, 1, 3))
    rng = np.random.default_rng(seed)
    with tf.io.TFRecordWriter(path) as writer:
        for _ in range(num_records):
            label = int(rng.integers(num_classes))
            pixels = np.clip(palette[label][0] + rng.normal(0, 30, size=(image_size, image_size, 3)), 0, 255)
            jpeg = tf.io.encode_jpeg(pixels.astype(np.uint8)).numpy()
            writer.write(encode_example(jpeg, label + 1, image_size, image_size))


def write_dataset(out_dir: str, train_records: int, validation_records: int, num_classes: int,
                  image_size: int, num_files: int = 2) -> str:
    """``num_files`` training and validation files each in ``out_dir``; returns ``out_dir``."""
    os.makedirs(out_dir, exist_ok=True)
    splits = (("train", train_records), ("validation", validation_records))
    for split_index, (split, total) in enumerate(splits):
        for index in range(num_files):
            path = os.path.join(out_dir, f"{split}-{index:05d}-of-{num_files:05d}")
            write_split(path, total // num_files, num_classes, image_size, seed=split_index * num_files + index)
    return out_dir


def main(argv: Optional[Sequence[str]] = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--out_dir", required=True)
    parser.add_argument("--train_records", type=int, default=256)
    parser.add_argument("--validation_records", type=int, default=64)
    parser.add_argument("--num_classes", type=int, default=10)
    parser.add_argument("--image_size", type=int, default=80, help="side of the JPEGs")
    args = parser.parse_args(argv)
    out_dir = write_dataset(args.out_dir, args.train_records, args.validation_records, args.num_classes,
                            args.image_size)
    print(f"wrote {args.train_records} training and {args.validation_records} validation records to {out_dir}")
    return out_dir


if __name__ == "__main__":
    main()
