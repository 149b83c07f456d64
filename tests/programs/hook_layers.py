"""Identity Keras layers that run Python on the executors at every training step, to inject faults in tests."""

import keras
import tensorflow as tf


class PythonHook(keras.layers.Layer):
    """Identity layer that runs ``hook()`` in Python on the executor at every step (a ``tf.py_function``)."""

    def hook(self):
        raise NotImplementedError

    def call(self, inputs):
        def run(values):
            self.hook()
            return values

        out = tf.py_function(run, [inputs], tf.float32)
        out.set_shape(inputs.shape)
        return out


def raise_once(owner, name, error):
    """Make ``owner.name`` raise ``error`` at its next call only, then be itself again (a reused Python worker
    runs later tests); nothing changes while it is armed."""
    original = getattr(owner, name)
    if getattr(original, "raises_once", False):
        return

    def raising(*args, **kwargs):
        setattr(owner, name, original)
        raise error

    raising.raises_once = True
    setattr(owner, name, raising)
