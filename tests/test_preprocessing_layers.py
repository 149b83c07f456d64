"""Models that carry their own preprocessing state (adapted lookups, TextVectorization, Normalization,
Discretization, Hashing, CategoryEncoding, a FeatureSpace) train, evaluate and predict from DataFrame columns exactly
as ``fit``, ``evaluate`` and ``predict`` in one process."""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from sparktf import MaxIteration, TFDataset, TFOptimizer, TFPredictor
from sparktf.errors import ModelError
from sparktf.models.payload import ModelPayload

CITIES = np.array(["paris", "rome", "oslo", "lima", "kyiv"])
WORDS = np.array(["red", "green", "blue", "dark", "light", "sky"])
ROWS = 48


def _columns(seed=0):
    rng = np.random.default_rng(seed)
    city = CITIES[rng.integers(0, len(CITIES), ROWS)]
    code = rng.integers(0, 30, ROWS).astype(np.int64)
    text = np.array([" ".join(rng.choice(WORDS, int(rng.integers(1, 5)))) for _ in range(ROWS)])
    age = rng.normal(40, 12, ROWS).astype(np.float32)
    label = ((city == "rome") | (age > 45) | np.char.startswith(text, "red")).astype(np.int64)
    return {"city": city, "code": code, "text": text, "age": age, "label": label}


def _adapted_model(columns, seed=1):
    """Every stateful preprocessing layer, each output mode asked for, adapted (or given) on the columns."""
    keras.utils.set_random_seed(seed)
    city_one_hot = keras.layers.StringLookup(output_mode="one_hot")
    city_one_hot.adapt(columns["city"])
    city_given = keras.layers.StringLookup(vocabulary=list(CITIES[:3]), output_mode="int")
    code_multi = keras.layers.IntegerLookup(output_mode="multi_hot")
    code_multi.adapt(columns["code"])
    code_given = keras.layers.IntegerLookup(vocabulary=list(range(10)), output_mode="one_hot")
    words_tf_idf = keras.layers.TextVectorization(output_mode="tf_idf")
    words_tf_idf.adapt(columns["text"])
    words_int = keras.layers.TextVectorization(output_mode="int", output_sequence_length=4)
    words_int.adapt(columns["text"])
    age_norm = keras.layers.Normalization(axis=None)
    age_norm.adapt(columns["age"])
    age_bins = keras.layers.Discretization(num_bins=4)
    age_bins.adapt(columns["age"])

    city = keras.Input((), dtype="string", name="city")
    code = keras.Input((), dtype="int64", name="code")
    text = keras.Input((), dtype="string", name="text")
    age = keras.Input((), dtype="float32", name="age")
    column = keras.layers.Reshape((1,))
    parts = [
        city_one_hot(city),
        keras.layers.CategoryEncoding(4, output_mode="one_hot")(city_given(city)),
        code_multi(column(code)),
        code_given(code),
        words_tf_idf(text),
        keras.layers.Embedding(words_int.vocabulary_size(), 2)(words_int(text)),
        column(age_norm(age)),
        keras.layers.CategoryEncoding(4, output_mode="one_hot")(age_bins(age)),
        keras.layers.Hashing(8, output_mode="one_hot")(column(city)),
    ]
    flat = [keras.layers.Flatten()(part) for part in parts]
    hidden = keras.layers.Dense(8, activation="relu")(keras.layers.Concatenate()(flat))
    model = keras.Model([city, code, text, age], keras.layers.Dense(2)(hidden))
    model.compile(keras.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def _inputs(columns):
    return [columns["city"].astype(object), columns["code"], columns["text"].astype(object), columns["age"]]


def _frame(spark, columns):
    rows = list(zip(*(columns[name].tolist() for name in ("city", "code", "text", "age", "label"))))
    return spark.createDataFrame(rows, "city string, code long, text string, age float, label long").repartition(2)


def test_adapted_lookups_and_vectorizers_train_evaluate_and_predict_as_fit(spark):
    columns = _columns()
    frame = _frame(spark, columns).cache()
    collected = frame.collect()  # the frame's own order, for the one-process reference
    ordered = {name: np.array([row[name] for row in collected]) for name in columns}
    ordered["age"] = ordered["age"].astype(np.float32)
    features = ["city", "code", "text", "age"]

    reference = _adapted_model(columns)
    model = _adapted_model(columns)
    model.set_weights(reference.get_weights())
    reference.fit(_inputs(ordered), ordered["label"], batch_size=ROWS, epochs=4, shuffle=False, verbose=0)

    dataset = TFDataset.from_dataframe(frame, features, "label", batch_size=ROWS)  # full batches: order-free
    optimizer = TFOptimizer.from_keras(model, dataset)
    history = optimizer.optimize(MaxIteration(4))

    for variable, want in zip(model.weights, reference.get_weights()):
        np.testing.assert_allclose(variable.numpy(), want, atol=1e-5, err_msg=variable.path)
    assert history["loss"][-1] == pytest.approx(reference.history.history["loss"][-1], abs=1e-5)
    expected = reference.evaluate(_inputs(ordered), ordered["label"], verbose=0, return_dict=True)
    assert optimizer.evaluate(batch_per_thread=7) == pytest.approx(expected, abs=1e-5)

    predicted = reference.predict(_inputs(ordered), verbose=0)
    scored = TFPredictor.from_keras(model, TFDataset.from_dataframe(frame, features, batch_per_thread=5)) \
        .predict_dataframe(frame, features).select("prediction").collect()
    np.testing.assert_allclose([row["prediction"] for row in scored], predicted, atol=1e-5)


def test_a_feature_space_inside_the_model_predicts_as_in_one_process(spark):
    columns = _columns(seed=2)
    space = keras.utils.FeatureSpace(
        features={"city": keras.utils.FeatureSpace.string_categorical(num_oov_indices=1),
                  "age": keras.utils.FeatureSpace.float_normalized(),
                  "code": keras.utils.FeatureSpace.integer_hashed(num_bins=16)},
        output_mode="concat")
    space.adapt(_tf_dataset({name: columns[name] for name in ("city", "age", "code")}))
    inputs = space.get_inputs()
    model = keras.Model(inputs, keras.layers.Dense(1)(space.get_encoded_features()))
    frame = _frame(spark, columns).cache()
    rows = frame.collect()  # the frame's own order
    features = sorted(inputs)
    with warnings.catch_warnings():  # Keras' own: a FeatureSpace's inputs name themselves, "doesn't match"
        warnings.filterwarnings("ignore", "The structure of `inputs` doesn't match")
        expected = model.predict(_tf_dataset({name: np.array([[row[name]] for row in rows]) for name in features}),
                                 verbose=0)
    # the columns are scalars, the space's inputs take [1] per record: a map on the workers reshapes them
    dataset = TFDataset.from_dataframe(frame, features, batch_per_thread=6).map(
        lambda columns: {name: tf.reshape(column, [-1, 1]) for name, column in zip(features, columns)})
    assert sorted(dataset.feature_spec) == features and dataset.feature_spec["age"].shape == [1]
    got = np.concatenate(TFPredictor.from_keras(model, dataset).predict().collect())
    np.testing.assert_allclose(got, expected.ravel(), atol=1e-5)


def _tf_dataset(columns):
    return tf.data.Dataset.from_tensor_slices(columns).batch(16)


def test_a_layer_that_cannot_save_its_state_is_a_model_error_on_the_driver():
    lookup = keras.layers.StringLookup(output_mode="int")  # neither adapted nor given a vocabulary: fine
    text = keras.Input((), dtype="string")
    ModelPayload.from_model(keras.Model(text, lookup(text)))

    class Broken(keras.layers.Layer):
        def save_assets(self, dir_path):
            raise ValueError("No vocabulary has been set for Broken")

        def call(self, x):
            return x

    with pytest.raises(ModelError, match=r"(?s)layers/broken.*Broken.*No vocabulary"):
        ModelPayload.from_model(keras.Model(text, Broken(name="broken")(text)))


def test_export_tf_of_a_model_with_lookup_tables_is_a_model_error_naming_them(tmp_path):
    from sparktf.net import export_tf

    lookup = keras.layers.StringLookup(output_mode="one_hot", name="cities")
    lookup.adapt(CITIES)
    city = keras.Input((), dtype="string")
    with pytest.raises(ModelError, match=r"(?s)lookup tables \(.*cities.*TFPredictor.from_keras"):
        export_tf(keras.Model(city, keras.layers.Dense(2)(lookup(city))), str(tmp_path / "export"))
