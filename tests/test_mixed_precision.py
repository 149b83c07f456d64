"""Keras mixed-precision policies train through TFOptimizer: loss scaling, skipped overflow steps, 1 vs 2 workers."""

import keras
import numpy as np
import pytest

from sparktf import MaxIteration, TFDataset, TFOptimizer
from sparktf.models.payload import ModelPayload
from sparktf.models.rebuild import policy_named as global_policy  # Keras' global policy inside a with block


def train(policy, workers, optimizer, iterations):
    """Full-batch training (the same global batch on 1 and 2 workers); the model and its history."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 8)).astype(np.float32)
    y = (x @ rng.normal(size=(8, 1))).astype(np.float32)
    with global_policy(policy):
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(1, dtype="float32")])
        model.compile(optimizer, "mse")
    dataset = TFDataset.from_ndarrays((x, y), batch_size=64, seed=2)
    history = TFOptimizer.from_keras(model, dataset, num_workers=workers).optimize(
        MaxIteration(iterations), verbose=0)
    assert history["iterations"] == iterations and np.isfinite(history["loss"]).all()
    assert history["loss"][-1] < history["loss"][0]
    return model


# The step runs in float16 (10-bit mantissa) or bfloat16 (7-bit) while the all-reduce sums float32 gradients;
# one worker's matmul over 64 records and two workers' over 32 each round differently. Measured here: weights
# differ by at most 2.5e-3 (bfloat16) and 1.6e-4 (float16) after 12 steps, 7e-5 in the overflow test; the
# tolerances leave ~10x room, while a rank that skipped or applied another step would be off by ~0.05.
@pytest.mark.parametrize("policy, atol", [("mixed_bfloat16", 3e-2), ("mixed_float16", 2e-3)])
def test_mixed_precision_trains_the_same_on_one_and_two_workers(sc, policy, atol):
    one, two = (train(policy, workers, keras.optimizers.SGD(0.05), 12) for workers in (1, 2))
    assert type(one.optimizer).__name__ == ("LossScaleOptimizer" if policy == "mixed_float16" else "SGD")
    for a, b in zip(one.get_weights(), two.get_weights()):
        np.testing.assert_allclose(a, b, atol=atol)


def test_overflowing_loss_scaled_steps_are_skipped_on_every_rank_and_the_scale_lowered(sc):
    def optimizer():
        return keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.05), initial_scale=2.0 ** 32)

    one, two = (train("mixed_float16", workers, optimizer(), 30) for workers in (1, 2))
    for model in (one, two):
        scale = float(model.optimizer.scale_loss(1.0))
        applied = int(model.optimizer.inner_optimizer.iterations.numpy())
        assert scale < 2.0 ** 32 and 0 < applied < 30, (scale, applied)  # float16 gradients overflowed at first
    assert float(one.optimizer.scale_loss(1.0)) == float(two.optimizer.scale_loss(1.0))
    assert int(one.optimizer.inner_optimizer.iterations) == int(two.optimizer.inner_optimizer.iterations)
    for a, b in zip(one.get_weights(), two.get_weights()):
        np.testing.assert_allclose(a, b, atol=2e-3)


def test_a_functional_mixed_float16_model_is_rebuilt_with_its_loss_scale_optimizer():
    """A functional model's config has no policy of its own (Sequential's has): a worker under float32 used to
    rebuild it with a plain optimizer, and every segment failed restoring the optimizer variables."""
    with global_policy("mixed_float16"):
        inputs = keras.Input((8,))
        model = keras.Model(inputs, keras.layers.Dense(1, dtype="float32")(keras.layers.Dense(4)(inputs)))
        model.compile(keras.optimizers.SGD(0.05, momentum=0.9), "mse")
    model.optimizer.build(model.trainable_variables)
    rebuilt = ModelPayload.from_bytes(ModelPayload.from_model(model).to_bytes()).build()
    assert type(rebuilt.optimizer).__name__ == "LossScaleOptimizer"
    assert len(rebuilt.optimizer.variables) == len(model.optimizer.variables)
    assert keras.mixed_precision.global_policy().name == "float32"
