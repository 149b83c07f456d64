"""ResNet-20/56 (v1, the CIFAR-10 variant) trained on Spark with sparktf's TFOptimizer.

The TensorFlowOnSpark ResNet-CIFAR example as a sparktf program: the same
flags (``--data_dir`` is the ``cifar-10-batches-bin`` folder,
``--train_epochs``, ``--batch_size``, ``--model_dir``), the standard
schedule (learning rate 0.1 x batch/128, divided by 10 at epochs 91 and 136
of 182, scaled to ``--train_epochs``), random crop (pad 4) and flip,
validation on ``test_batch.bin`` after every epoch, TensorBoard summaries and
a checkpoint per epoch in ``--model_dir``; a run whose ``--model_dir`` holds a
checkpoint resumes from it. Last line: ``accuracy=... images/s=...``.

    python examples/resnet_cifar.py --data_dir /data/cifar-10-batches-bin --train_epochs 182
    spark-submit --master spark://host:7077 examples/resnet_cifar.py --synthetic --train_epochs 2
"""

from __future__ import annotations

import os
import tempfile
from typing import Dict, Optional, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import sparktf  # noqa: F401 - before TensorFlow: keeps its start-up log lines out of the output

import keras

import cifar10_data
from example_support import add_training_flags, compile_with_step_decay, example_parser, global_batch
from example_support import start_spark, train_and_validate
from image_augmentation import RandomCropFlip
from sparktf import TFDataset

#: Epochs of the standard 182-epoch schedule where the learning rate drops 10x.
DECAY_EPOCHS = (91, 136)
STANDARD_EPOCHS = 182
WEIGHT_DECAY = 2e-4


def residual_block(x, filters: int, strides: int):
    """Two 3x3 conv-BN layers and the shortcut (a 1x1 projection when the shape changes), then ReLU."""
    regularizer = keras.regularizers.L2(WEIGHT_DECAY)
    shortcut = x
    y = keras.layers.Conv2D(filters, 3, strides=strides, padding="same", use_bias=False,
                            kernel_initializer="he_normal", kernel_regularizer=regularizer)(x)
    y = keras.layers.BatchNormalization()(y)
    y = keras.layers.Activation("relu")(y)
    y = keras.layers.Conv2D(filters, 3, padding="same", use_bias=False,
                            kernel_initializer="he_normal", kernel_regularizer=regularizer)(y)
    y = keras.layers.BatchNormalization()(y)
    if strides != 1 or x.shape[-1] != filters:
        shortcut = keras.layers.Conv2D(filters, 1, strides=strides, use_bias=False,
                                       kernel_initializer="he_normal", kernel_regularizer=regularizer)(x)
        shortcut = keras.layers.BatchNormalization()(shortcut)
    return keras.layers.Activation("relu")(keras.layers.Add()([y, shortcut]))


def build_resnet(resnet_size: int) -> keras.Model:
    """ResNet-``resnet_size`` v1 for 32x32 images (``resnet_size`` = 6n + 2: 20, 32, 44, 56, 110).

    The input is the raw uint8 image; augmentation (training only) and scaling
    to [-1, 1] are the model's first layers.
    """
    if (resnet_size - 2) % 6:
        raise ValueError(f"--resnet_size must be 6n + 2 (20, 32, 44, 56, 110), got {resnet_size}")
    blocks_per_stage = (resnet_size - 2) // 6
    inputs = keras.Input((cifar10_data.HEIGHT, cifar10_data.WIDTH, cifar10_data.CHANNELS), dtype="uint8")
    x = keras.layers.Rescaling(1 / 127.5, offset=-1.0)(inputs)
    x = RandomCropFlip(cifar10_data.HEIGHT, pad=4)(x)
    x = keras.layers.Conv2D(16, 3, padding="same", use_bias=False, kernel_initializer="he_normal",
                            kernel_regularizer=keras.regularizers.L2(WEIGHT_DECAY))(x)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.Activation("relu")(x)
    for stage, filters in enumerate((16, 32, 64)):
        for block in range(blocks_per_stage):
            x = residual_block(x, filters, strides=2 if stage > 0 and block == 0 else 1)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(cifar10_data.NUM_CLASSES, activation="softmax",
                                 kernel_regularizer=keras.regularizers.L2(WEIGHT_DECAY))(x)
    return keras.Model(inputs, outputs, name=f"resnet{resnet_size}_cifar")


def parse_args(argv: Optional[Sequence[str]]):
    parser = example_parser(__doc__.splitlines()[0])
    parser.add_argument("--data_dir", default=None, help="the cifar-10-batches-bin folder")
    parser.add_argument("--synthetic", action="store_true",
                        help="generated records in the CIFAR-10 format instead of --data_dir")
    parser.add_argument("--resnet_size", type=int, default=20, choices=(20, 32, 44, 56, 110))
    parser.add_argument("--batch_size", type=int, default=128, help="global batch (all workers)")
    add_training_flags(parser, STANDARD_EPOCHS)
    args = parser.parse_args(argv)
    if args.smoke:
        args.synthetic, args.resnet_size, args.train_epochs = True, 20, 1
        args.batch_size = min(args.batch_size, 16)
    if args.data_dir is None and not args.synthetic:
        parser.error("give --data_dir (the cifar-10-batches-bin folder) or --synthetic")
    return args


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, float]:
    """Train and validate; returns ``train_and_validate``'s results."""
    args = parse_args(argv)
    spark = start_spark(args, "sparktf-resnet-cifar")
    sc = spark.sparkContext
    data_dir = args.data_dir
    if args.synthetic:
        records_per_file = 16 if args.smoke else 2000
        data_dir = cifar10_data.write_synthetic_dir(tempfile.mkdtemp(prefix="sparktf-cifar-"), records_per_file)
    batch_size = global_batch(args.batch_size, args.num_workers)
    dataset = TFDataset.from_rdd(
        cifar10_data.read_rdd(sc, data_dir, train=True).repartition(args.num_workers),
        features=("uint8", [cifar10_data.HEIGHT, cifar10_data.WIDTH, cifar10_data.CHANNELS]),
        labels=("int32", []),
        batch_size=batch_size,
        val_rdd=cifar10_data.read_rdd(sc, data_dir, train=False),
        seed=0,
    )
    model = build_resnet(args.resnet_size)
    compile_with_step_decay(model, 0.1 * batch_size / 128, DECAY_EPOCHS, STANDARD_EPOCHS, args.train_epochs,
                            dataset.iterations_per_epoch(args.num_workers))
    print(f"ResNet-{args.resnet_size} on {dataset.num_records} images, {args.num_workers} workers, "
          f"global batch {batch_size}, {args.train_epochs} epochs")
    return train_and_validate(model, dataset, args.model_dir, "resnet_cifar", args.train_epochs, args.num_workers)


if __name__ == "__main__":
    main()
