"""ImageNet-style TFRecords (as written by TensorFlow models' ``build_imagenet_data.py``) and their preprocessing.

Each ``tf.train.Example`` holds ``image/encoded`` (JPEG bytes),
``image/class/label`` (int64, 1-based: 1..1000, 0 is "background"),
``image/format``, ``image/height``, ``image/width``, ``image/channels``.
Files are named ``train-00000-of-01024`` and ``validation-00000-of-00128``.

The preprocessing is the standard ResNet one (TensorFlow models'
``imagenet_preprocessing.py``): for training a random-resized crop of the JPEG
(decoded only inside the crop), a random horizontal flip and a resize to the
network's input; for evaluation an aspect-preserving resize (shorter side
256/224 of the input) and the central crop. Both then normalise with
ImageNet's per-channel mean and deviation. Made into ``parse_fn`` by
:func:`record_parser`, it runs in ``tf.data`` on the executors; with
``TFDataset.from_tfrecord_file(..., cache=False)`` it runs again every epoch,
so every epoch draws new crops and flips.
"""

from __future__ import annotations

from typing import Callable

import tensorflow as tf

#: The standard per-channel RGB mean and standard deviation of ImageNet, in [0, 255].
RGB_MEAN = (123.68, 116.78, 103.94)
RGB_STD = (58.39, 57.12, 57.38)
TRAIN_PATTERN = "train-*"
VALIDATION_PATTERN = "validation-*"
#: Training's random-resized crop covers this fraction of the image's area ...
CROP_AREA_RANGE = (0.05, 1.0)
#: ... with a width / height ratio in this range.
CROP_ASPECT_RATIO_RANGE = (0.75, 1.33)


def encode_example(jpeg: bytes, label: int, height: int, width: int) -> bytes:
    """One serialized ``tf.train.Example`` in the ImageNet TFRecord layout."""

    def bytes_feature(value: bytes) -> tf.train.Feature:
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))

    def int_feature(value: int) -> tf.train.Feature:
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))

    features = {
        "image/encoded": bytes_feature(jpeg),
        "image/format": bytes_feature(b"JPEG"),
        "image/class/label": int_feature(label),
        "image/height": int_feature(height),
        "image/width": int_feature(width),
        "image/channels": int_feature(3),
    }
    return tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()


def parse_example(serialized: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """``(JPEG bytes, 0-based int32 label)`` from one serialized ``tf.train.Example``."""
    parsed = tf.io.parse_single_example(serialized, {
        "image/encoded": tf.io.FixedLenFeature([], tf.string),
        "image/class/label": tf.io.FixedLenFeature([], tf.int64),
    })
    return parsed["image/encoded"], tf.cast(parsed["image/class/label"] - 1, tf.int32)


def normalize(image: tf.Tensor) -> tf.Tensor:
    """``image`` (RGB in [0, 255]) as float32 minus ImageNet's channel means, divided by their deviations."""
    return (tf.cast(image, tf.float32) - tf.constant(RGB_MEAN)) / tf.constant(RGB_STD)


def preprocess_for_training(jpeg: tf.Tensor, image_size: int) -> tf.Tensor:
    """A random-resized crop of ``jpeg``, randomly flipped, as a normalised float32 ``(image_size, image_size, 3)``.

    The crop window is drawn by ``tf.image.sample_distorted_bounding_box``
    on the JPEG's encoded shape (the whole image as the object's box, at
    least 10% of it covered, 100 attempts, else the whole image), and only
    that window is decoded. Each call draws a new window and flip.

    Parameters
    ----------
    jpeg : tf.Tensor
        Scalar ``tf.string``: the encoded JPEG.
    image_size : int
        Side of the square output.
    """
    begin, size, _ = tf.image.sample_distorted_bounding_box(
        tf.image.extract_jpeg_shape(jpeg),
        bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]),
        min_object_covered=0.1,
        aspect_ratio_range=CROP_ASPECT_RATIO_RANGE,
        area_range=CROP_AREA_RANGE,
        max_attempts=100,
        use_image_if_no_bounding_boxes=True,
    )
    crop_window = tf.concat([begin[:2], size[:2]], axis=0)  # offset_y, offset_x, height, width
    crop = tf.image.decode_and_crop_jpeg(jpeg, crop_window, channels=3)
    crop = tf.image.random_flip_left_right(crop)
    return normalize(tf.image.resize(crop, [image_size, image_size]))


def preprocess_for_evaluation(jpeg: tf.Tensor, image_size: int) -> tf.Tensor:
    """The central crop of ``jpeg`` as a normalised float32 ``(image_size, image_size, 3)`` (deterministic).

    The decoded image is resized, keeping its aspect ratio, so that its
    shorter side is ``image_size`` x 256/224 (256 for 224); the central
    ``image_size`` square of that is kept.

    Parameters
    ----------
    jpeg : tf.Tensor
        Scalar ``tf.string``: the encoded JPEG.
    image_size : int
        Side of the square output.
    """
    image = tf.io.decode_jpeg(jpeg, channels=3)
    shorter_side = image_size * 256 // 224
    height_width = tf.cast(tf.shape(image)[:2], tf.float32)
    scale = shorter_side / tf.reduce_min(height_width)
    resized_shape = tf.maximum(tf.cast(tf.round(height_width * scale), tf.int32), shorter_side)
    image = tf.image.resize(image, resized_shape)
    return normalize(tf.image.resize_with_crop_or_pad(image, image_size, image_size))


def record_parser(preprocess: Callable[[tf.Tensor, int], tf.Tensor], image_size: int) -> Callable:
    """A ``parse_fn`` for ``TFDataset.from_tfrecord_file``: serialized Example -> ``(image, 0-based label)``.

    Parameters
    ----------
    preprocess : callable
        :func:`preprocess_for_training` or :func:`preprocess_for_evaluation`.
    image_size : int
        Side of the square images it returns.
    """

    # Unannotated: AutoGraph evaluates annotations again, and on the executors
    # this closure's globals hold only the names its body uses (not ``tf``).
    def parse(serialized):
        jpeg, label = parse_example(serialized)
        return preprocess(jpeg, image_size), label

    return parse
