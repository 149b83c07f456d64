"""ImageNet-style TFRecords (as written by TensorFlow models' ``build_imagenet_data.py``).

Each ``tf.train.Example`` holds ``image/encoded`` (JPEG bytes),
``image/class/label`` (int64, 1-based: 1..1000, 0 is "background"),
``image/format``, ``image/height``, ``image/width``, ``image/channels``.
Files are named ``train-00000-of-01024`` and ``validation-00000-of-00128``.
"""

from __future__ import annotations

import tensorflow as tf

#: The standard per-channel RGB mean and standard deviation of ImageNet, in [0, 255].
RGB_MEAN = (123.68, 116.78, 103.94)
RGB_STD = (58.39, 57.12, 57.38)
TRAIN_PATTERN = "train-*"
VALIDATION_PATTERN = "validation-*"


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


def decode_and_resize(serialized: tf.Tensor, size: int):
    """``(uint8 image of shape (size, size, 3), 0-based int32 label)`` from one serialized Example.

    The JPEG is decoded and resized to ``size`` x ``size``; the random or
    central crop and the normalisation are the model's first layers (see
    ``image_augmentation.RandomCropFlip``).
    """
    parsed = tf.io.parse_single_example(serialized, {
        "image/encoded": tf.io.FixedLenFeature([], tf.string),
        "image/class/label": tf.io.FixedLenFeature([], tf.int64),
    })
    image = tf.io.decode_jpeg(parsed["image/encoded"], channels=3)
    image = tf.image.resize(image, [size, size], antialias=True)
    image = tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8)
    label = tf.cast(parsed["image/class/label"] - 1, tf.int32)
    return image, label
