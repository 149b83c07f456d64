"""Training-time image augmentation as a Keras layer, so it runs inside the training step.

sparktf caches the records of ``resnet_cifar.py``'s dataset, so augmentation
done before training would be drawn once and then repeated every epoch.
Inside the model it is drawn afresh for every batch, and switched off for
validation and prediction. (``imagenet_resnet.py`` instead augments in its
``parse_fn``, on TFRecords read with ``cache=False``.)
"""

from __future__ import annotations

import keras
import tensorflow as tf


class RandomCropFlip(keras.layers.Layer):
    """Zero-pad, then a random ``crop_size`` square and a random horizontal flip per image.

    In training every image gets its own crop and flip; otherwise the layer
    returns the central ``crop_size`` square (the evaluation preprocessing).

    Parameters
    ----------
    crop_size : int
        Side of the square output.
    pad : int
        Zeros added on each side before cropping (4 for CIFAR-10).
    """

    def __init__(self, crop_size: int, pad: int = 0, **kwargs) -> None:
        super().__init__(**kwargs)
        self.crop_size = int(crop_size)
        self.pad = int(pad)

    def call(self, images: tf.Tensor, training: bool = False) -> tf.Tensor:
        if self.pad:
            images = tf.pad(images, [[0, 0], [self.pad, self.pad], [self.pad, self.pad], [0, 0]])
        if not training:
            return self._central_crop(images)
        return self._random_crop_and_flip(images)

    def _random_crop_and_flip(self, images: tf.Tensor) -> tf.Tensor:
        batch = tf.shape(images)[0]
        window = tf.range(self.crop_size)
        tops = tf.random.uniform([batch], 0, images.shape[1] - self.crop_size + 1, dtype=tf.int32)
        lefts = tf.random.uniform([batch], 0, images.shape[2] - self.crop_size + 1, dtype=tf.int32)
        crops = tf.gather(images, tops[:, None] + window, axis=1, batch_dims=1)
        crops = tf.gather(crops, lefts[:, None] + window, axis=2, batch_dims=1)
        flip = tf.random.uniform([batch, 1, 1, 1]) < 0.5
        return tf.where(flip, tf.reverse(crops, axis=[2]), crops)

    def _central_crop(self, images: tf.Tensor) -> tf.Tensor:
        top = (images.shape[1] - self.crop_size) // 2
        left = (images.shape[2] - self.crop_size) // 2
        return images[:, top:top + self.crop_size, left:left + self.crop_size, :]

    def compute_output_shape(self, input_shape):
        return (input_shape[0], self.crop_size, self.crop_size, input_shape[-1])

    def get_config(self) -> dict:
        return {**super().get_config(), "crop_size": self.crop_size, "pad": self.pad}
