"""TFNet as a frozen feature extractor under a trainable head, trained by TFOptimizer."""

import keras
import numpy as np

from sparktf import MaxEpoch, TFDataset, TFOptimizer
from sparktf.net import TFNet, export_tf


def test_frozen_tfnet_under_a_trainable_head_trains_with_tfoptimizer(sc, tmp_path):
    keras.utils.set_random_seed(5)
    inputs = keras.Input((4,))
    extractor = keras.Model(inputs, keras.layers.Dense(3, activation="tanh")(inputs))
    net = TFNet.from_export_folder(export_tf(extractor, tmp_path / "extractor"))
    graph_before = net.graph_def.SerializeToString(deterministic=True)

    head = keras.layers.Dense(1, name="head")
    model_inputs = keras.Input((4,))
    model = keras.Model(model_inputs, head(net(model_inputs)))
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
    assert net.trainable_weights == []

    rng = np.random.default_rng(11)
    x = rng.normal(size=(256, 4)).astype("float32")
    y = extractor.predict(x, verbose=0) @ np.array([[1.0], [-2.0], [0.5]], "float32")
    dataset = TFDataset.from_ndarrays((x, y), batch_size=32, seed=1)
    head_before = head.get_weights()[0].copy()
    loss_before = model.evaluate(x, y, verbose=0)

    history = TFOptimizer.from_keras(model, dataset, num_workers=2).optimize(MaxEpoch(4))

    assert history["iterations"] == 4 * 8
    assert model.evaluate(x, y, verbose=0) < 0.5 * loss_before
    assert not np.allclose(head.get_weights()[0], head_before)
    assert net.graph_def.SerializeToString(deterministic=True) == graph_before
