"""A text classifier (StringLookup over a tf.string input) trains, validates, evaluates and predicts."""

import keras
import numpy as np

from sparktf import MaxIteration, SeveralIteration, TFDataset, TFOptimizer, TFPredictor

WORDS = ["good", "great", "fine", "bad", "awful", "poor"]


def text_classifier():
    text = keras.Input((), dtype="string", name="text")
    ids = keras.layers.StringLookup(vocabulary=WORDS)(text)
    hidden = keras.layers.Embedding(len(WORDS) + 1, 4)(ids)
    model = keras.Model(text, keras.layers.Dense(2)(hidden))
    model.compile(
        optimizer=keras.optimizers.Adam(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def test_text_classifier_trains_validates_evaluates_and_predicts(sc):
    records = [(word, int(i >= 3)) for i, word in enumerate(WORDS)] * 4
    rdd = sc.parallelize(records, 2)
    dataset = TFDataset.from_rdd(
        rdd, features=("string", []), labels=("int32", []), batch_size=8, val_rdd=rdd, seed=1
    )
    model = text_classifier()
    optimizer = TFOptimizer.from_keras(model, dataset)
    history = optimizer.optimize(MaxIteration(12), validation_trigger=SeveralIteration(6))
    assert len(history["val_accuracy"]) == 2 and len(history["val_loss"]) == 2
    assert history["val_accuracy"][-1] == 1.0
    results = optimizer.evaluate(batch_per_thread=5)
    np.testing.assert_allclose(results["loss"], history["val_loss"][-1], rtol=1e-5, atol=1e-6)
    assert results["accuracy"] == 1.0
    words = TFDataset.from_string_rdd(sc.parallelize(WORDS, 2), batch_per_thread=4)
    predicted = np.array(TFPredictor.from_keras(model, words).predict().collect())
    assert predicted.shape == (6, 2)
    assert list(predicted.argmax(axis=1)) == [0, 0, 0, 1, 1, 1]
