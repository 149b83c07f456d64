"""ResNet-50/101 trained on ImageNet-style TFRecords with sparktf, printing images/s.

The ImageNet ResNet examples of the seeds as a sparktf program:
``--data_dir`` holds ``train-*`` and ``validation-*`` TFRecord files
(``image/encoded`` JPEG, ``image/class/label``, ... as written by
``build_imagenet_data.py``, or by ``make_synthetic_imagenet.py``), read with
``TFDataset.from_tfrecord_file(..., cache=False)``: the records are not
cached, so their ``parse_fn`` runs in ``tf.data`` on the executors every
epoch and applies the standard ResNet preprocessing (``imagenet_records``)
afresh. Training: a random-resized crop of each JPEG, a random flip, a
resize to ``--image_size``; validation (a second dataset with its own
``parse_fn``, evaluated after training): an aspect-preserving resize and
the central crop. Both normalise with ImageNet's mean and deviation, and
the network takes the float32 result as it is. SGD with momentum 0.9 at
0.1 x batch/256, divided by 10 at epochs 30, 60 and 80 of 90 (scaled to
``--train_epochs``). Last line: ``accuracy=... images/s=...``.

    spark-submit --master spark://host:7077 --driver-memory 8g examples/imagenet_resnet.py \\
        --data_dir /data/imagenet --train-batch-size=256 --resnet_size=101
"""

from __future__ import annotations

import os
import tempfile
from typing import Dict, Optional, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import sparktf  # noqa: F401 - before TensorFlow: keeps its start-up log lines out of the output

import keras

import imagenet_records
from example_support import add_training_flags, compile_with_step_decay, example_parser, global_batch
from example_support import start_spark, train_and_validate
from make_synthetic_imagenet import write_dataset
from sparktf import TFDataset

ARCHITECTURES = {50: keras.applications.ResNet50, 101: keras.applications.ResNet101}
DECAY_EPOCHS = (30, 60, 80)
STANDARD_EPOCHS = 90


def build_model(resnet_size: int, image_size: int, num_classes: int) -> keras.Model:
    """Keras' ResNet-``resnet_size`` (no pretrained weights) taking the preprocessed float32 images.

    Its input is ``image_size`` x ``image_size`` x 3, as ``imagenet_records``' preprocessing returns.
    """
    return ARCHITECTURES[resnet_size](weights=None, input_shape=(image_size, image_size, 3), classes=num_classes)


def parse_args(argv: Optional[Sequence[str]]):
    parser = example_parser(__doc__.splitlines()[0])
    parser.add_argument("--data_dir", default=None, help="folder of train-* and validation-* TFRecord files")
    parser.add_argument("--resnet_size", type=int, default=50, choices=sorted(ARCHITECTURES))
    parser.add_argument("--train-batch-size", "--train_batch_size", dest="train_batch_size", type=int,
                        default=32, help="global batch (all workers)")
    parser.add_argument("--image_size", type=int, default=224, help="side of the crop the network sees")
    parser.add_argument("--num_classes", type=int, default=1000)
    add_training_flags(parser, STANDARD_EPOCHS)
    args = parser.parse_args(argv)
    if args.smoke:
        args.image_size, args.num_classes, args.train_epochs = 32, 4, 1
        args.train_batch_size = min(args.train_batch_size, 4)
    if args.data_dir is None and not args.smoke:
        parser.error("give --data_dir (ImageNet TFRecords; make_synthetic_imagenet.py writes some)")
    return args


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, float]:
    """Train and validate; returns ``train_and_validate``'s results."""
    args = parse_args(argv)
    start_spark(args, "sparktf-imagenet-resnet")
    data_dir = args.data_dir
    if data_dir is None:
        data_dir = write_dataset(tempfile.mkdtemp(prefix="sparktf-imagenet-"), train_records=8,
                                 validation_records=4, num_classes=args.num_classes, image_size=40)
    batch_size = global_batch(args.train_batch_size, args.num_workers)
    dataset = TFDataset.from_tfrecord_file(
        os.path.join(data_dir, imagenet_records.TRAIN_PATTERN),
        imagenet_records.record_parser(imagenet_records.preprocess_for_training, args.image_size),
        batch_size=batch_size,
        seed=0,
        cache=False,
    )
    validation = TFDataset.from_tfrecord_file(
        os.path.join(data_dir, imagenet_records.VALIDATION_PATTERN),
        imagenet_records.record_parser(imagenet_records.preprocess_for_evaluation, args.image_size),
        batch_per_thread=batch_size // args.num_workers,
        cache=False,
    )
    model = build_model(args.resnet_size, args.image_size, args.num_classes)
    compile_with_step_decay(model, 0.1 * batch_size / 256, DECAY_EPOCHS, STANDARD_EPOCHS, args.train_epochs,
                            dataset.iterations_per_epoch(args.num_workers))
    print(f"ResNet-{args.resnet_size} at {args.image_size}x{args.image_size} on {dataset.num_records} images, "
          f"{args.num_workers} workers, global batch {batch_size}")
    results = train_and_validate(model, dataset, args.model_dir, "imagenet_resnet", args.train_epochs, args.num_workers,
                                 validation=validation)
    table_row = f"| imagenet-resnet-{args.resnet_size} | {args.num_workers} Spark workers |"
    print(f"{table_row} {results['images_per_sec']:.1f} |")
    return results


if __name__ == "__main__":
    main()
