"""TFNet and export_tf against real TensorFlow graphs, Keras models and Spark."""

import json
import os
from pathlib import Path

import cloudpickle
import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import save_module_with_two_signatures
from sparktf.errors import DataError
from sparktf.net import TFNet, export_tf

RNG = np.random.default_rng(7)
X = RNG.normal(size=(9, 4)).astype("float32")


@pytest.fixture(scope="module")
def model():
    """A small Keras model: 4 -> Dense(3, tanh) -> Dense(2)."""
    keras.utils.set_random_seed(1)
    inputs = keras.Input((4,), name="features")
    hidden = keras.layers.Dense(3, activation="tanh")(inputs)
    return keras.Model(inputs, keras.layers.Dense(2)(hidden))


@pytest.fixture(scope="module")
def export_dir(model, tmp_path_factory):
    return export_tf(model, tmp_path_factory.mktemp("export") / "net")


def _tf1_graph_def(model):
    """The model rebuilt as a classic TF1 frozen graph fed at 'Placeholder:0'."""
    w1, b1, w2, b2 = model.get_weights()
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 4])
        out = tf.matmul(tf.tanh(tf.matmul(x, w1) + b1), w2) + b2
    return graph.as_graph_def(), out.name


def _net(form, model, export_dir, tmp_path):
    if form == "saved_model":
        model.export(str(tmp_path / "saved"), verbose=False)
        return TFNet.from_saved_model(str(tmp_path / "saved"))
    if form == "frozen_graph_path":
        meta = json.loads((Path(export_dir) / "graph_meta.json").read_text())
        pb = Path(export_dir) / "frozen_inference_graph.pb"
        return TFNet.from_frozen_graph(str(pb), meta["input_names"], meta["output_names"])
    if form == "frozen_graph_def":
        graph_def, output = _tf1_graph_def(model)
        return TFNet.from_frozen_graph(graph_def, ["Placeholder:0"], [output])
    if form == "export_folder":
        return TFNet.from_export_folder(export_dir)
    function = tf.function(lambda x: model(x, training=False))
    return TFNet.from_function(function, [tf.TensorSpec([None, 4], tf.float32)])


def _input_gradient(fn, x):
    x = tf.constant(x)
    weights = tf.constant([[1.0, -2.0]])
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = tf.reduce_sum(fn(x) * weights)
    return tape.gradient(loss, x).numpy()


@pytest.mark.parametrize(
    "form", ["saved_model", "frozen_graph_path", "frozen_graph_def", "export_folder", "function"]
)
def test_every_form_matches_model_outputs_and_input_gradients(form, model, export_dir, tmp_path):
    net = _net(form, model, export_dir, tmp_path)
    expected = model(X, training=False).numpy()
    np.testing.assert_allclose(net.forward(X), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(net.predict(X, batch_per_thread=4), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        _input_gradient(net, X), _input_gradient(lambda t: model(t, training=False), X), rtol=1e-5, atol=1e-6
    )
    assert net.trainable_weights == [] and net.weights == []


def test_export_folder_layout(export_dir):
    assert sorted(os.listdir(export_dir)) == ["frozen_inference_graph.pb", "graph_meta.json"]
    meta = json.loads((Path(export_dir) / "graph_meta.json").read_text())
    assert meta["input_names"] == ["features:0"]
    assert meta["inputs"] == [{"dtype": "float32", "shape": [None, 4]}]
    graph_def = tf.compat.v1.GraphDef.FromString((Path(export_dir) / "frozen_inference_graph.pb").read_bytes())
    assert not [n.name for n in graph_def.node if n.op in ("VarHandleOp", "ReadVariableOp", "VariableV2")]


class _TwoHeads(tf.Module):
    def __init__(self):
        self.w = tf.Variable(np.arange(6, dtype="float32").reshape(3, 2))

    @tf.function(
        input_signature=[tf.TensorSpec([None, 3], tf.float32, "zeta"), tf.TensorSpec([None, 2], tf.float32, "alpha")]
    )
    def serve(self, zeta, alpha):
        return {"sum": tf.matmul(zeta, self.w) + alpha, "prod": alpha * 2.0}


@pytest.fixture(scope="module")
def two_heads_dir(tmp_path_factory):
    module = _TwoHeads()
    return save_module_with_two_signatures(module, module.serve, tmp_path_factory.mktemp("two_heads"))


def test_saved_model_inputs_and_outputs_select_and_order(two_heads_dir):
    zeta = RNG.normal(size=(5, 3)).astype("float32")
    alpha = RNG.normal(size=(5, 2)).astype("float32")
    w = np.arange(6, dtype="float32").reshape(3, 2)

    default = TFNet.from_saved_model(two_heads_dir)  # sorted keys: inputs alpha, zeta; outputs prod, sum
    prod, total = default.forward([alpha, zeta])
    np.testing.assert_allclose(prod, alpha * 2, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(total, zeta @ w + alpha, rtol=1e-5, atol=1e-6)

    chosen = TFNet.from_saved_model(two_heads_dir, signature="other", inputs=["zeta", "alpha"], outputs=["sum"])
    np.testing.assert_allclose(chosen.forward([zeta, alpha]), zeta @ w + alpha, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(chosen.forward({"zeta": zeta, "alpha": alpha}), zeta @ w + alpha, rtol=1e-5, atol=1e-6)

    inputs = [keras.Input((2,)), keras.Input((3,))]
    symbolic = default(inputs)
    assert [tuple(t.shape) for t in symbolic] == [(None, 2), (None, 2)]
    functional = keras.Model(inputs, symbolic)
    for got, want in zip(functional.predict([alpha, zeta], verbose=0), [prod, total]):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    with pytest.raises(DataError, match="takes 2 input.*got 1"):
        default(keras.Input((2,)))


def test_saved_model_errors_list_what_exists(two_heads_dir, tmp_path):
    with pytest.raises(DataError, match="serving_default.*other|other.*serving_default"):
        TFNet.from_saved_model(two_heads_dir, signature="predict")
    with pytest.raises(DataError, match="'beta'.*alpha, zeta"):
        TFNet.from_saved_model(two_heads_dir, inputs=["beta"])
    with pytest.raises(DataError, match="'total'.*prod, sum"):
        TFNet.from_saved_model(two_heads_dir, outputs=["total"])
    with pytest.raises(DataError, match="No SavedModel"):
        TFNet.from_saved_model(str(tmp_path))


def test_bad_names_and_input_counts_raise_data_error(model, tmp_path):
    graph_def, output = _tf1_graph_def(model)
    with pytest.raises(DataError, match="'input:0'.*Placeholder:0"):
        TFNet.from_frozen_graph(graph_def, ["input:0"], [output])
    with pytest.raises(DataError, match=f"'nope:0'.*{output}"):
        TFNet.from_frozen_graph(graph_def, ["Placeholder:0"], ["nope:0"])
    bad_index = TFNet.from_frozen_graph(graph_def, ["Placeholder:0"], [output.split(":")[0] + ":7"])
    with pytest.raises(DataError, match="Unknown output tensor .*:7"):  # found when the graph is first imported
        bad_index.forward(X)
    net = TFNet.from_frozen_graph(graph_def, ["Placeholder"], [output])  # ":0" is implied
    with pytest.raises(DataError, match="takes 1 input.*Placeholder:0.*got 2"):
        net.forward([X, X])
    with pytest.raises(DataError, match=r"shape \(None, 4\).*\(9, 5\)"):
        net.forward(np.zeros((9, 5), "float32"))
    with pytest.raises(DataError, match="lacks frozen_inference_graph.pb, graph_meta.json"):
        TFNet.from_export_folder(tmp_path)
    with pytest.raises(DataError, match="does not exist"):
        TFNet.from_frozen_graph(str(tmp_path / "missing.pb"), ["Placeholder:0"], [output])
    garbage = tmp_path / "garbage.pb"
    garbage.write_bytes(b"this is not a graph")
    with pytest.raises(DataError, match="garbage.pb' is not a binary GraphDef"):
        TFNet.from_frozen_graph(str(garbage), ["Placeholder:0"], [output])
    with pytest.raises(DataError, match="input_signature"):
        TFNet.from_function(tf.function(lambda x: x * 2))


_DTYPES = [tf.float32, tf.float64, tf.int32, tf.int64, tf.uint8, tf.string]


@pytest.fixture(scope="module")
def identity_net(tmp_path_factory):
    """An identity graph over one input per dtype, exported with export_tf from a tf.function."""
    signature = [tf.TensorSpec([None], dtype) for dtype in _DTYPES]
    function = tf.function(lambda *xs: [tf.identity(x) for x in xs], input_signature=signature)
    return TFNet.from_export_folder(export_tf(function, tmp_path_factory.mktemp("identity")))


def _identity_inputs():
    return [
        np.array([1.5, -2.25], "float32"),
        np.array([1 + 1e-12, -3.0], "float64"),
        np.array([2**31 - 1, -5], "int32"),
        np.array([2**62, -7], "int64"),
        np.array([0, 255], "uint8"),
        np.array([b"caf\xc3\xa9", b""], dtype=object),
    ]


def test_identity_graph_keeps_every_dtype(identity_net):
    inputs = _identity_inputs()
    outputs = identity_net.forward(inputs)
    for given, got, dtype in zip(inputs, outputs, _DTYPES):
        assert got.dtype == given.dtype, dtype
        np.testing.assert_array_equal(got, given)
    casted = identity_net.forward([[1, 2], [0.5, 1], [1.0, 2.0], [3, 4], [255.0, 1.0], ["x", "é"]])
    assert [o.dtype.name for o in casted[:5]] == ["float32", "float64", "int32", "int64", "uint8"]
    assert list(casted[4]) == [255, 1] and list(casted[5]) == [b"x", "é".encode()]


def test_identity_graph_distributed_keeps_every_dtype(identity_net, sc):
    inputs = _identity_inputs()
    records = [[column[i] for column in inputs] for i in range(2)]
    rows = identity_net.predict(sc.parallelize(records, 2), batch_per_thread=1).collect()
    for i, row in enumerate(rows):
        assert [value.dtype for value in row] == [column.dtype for column in inputs]
        assert [value.item() for value in row] == [column[i] for column in inputs]


def test_scalar_graph():
    net = TFNet.from_function(tf.function(lambda x: x * 2.0 + 1.0), [tf.TensorSpec([], tf.float32)])
    assert net.forward(np.float32(3.0)) == 7.0
    assert net.forward(3).shape == ()
    assert net.predict(np.array(2.0)) == 5.0


def test_non_contiguous_input(model, export_dir):
    net = TFNet.from_export_folder(export_dir)
    wide = RNG.normal(size=(9, 8))  # float64, cast to the graph's float32
    view = wide[:, ::2]
    fortran = np.asfortranarray(X)
    assert not view.flags.c_contiguous and not fortran.flags.c_contiguous
    np.testing.assert_allclose(net.forward(view), model(view.astype("float32")).numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(net.forward(fortran), net.forward(X))
    np.testing.assert_allclose(net.predict(X[::-1], batch_per_thread=2), net.forward(X)[::-1], rtol=1e-6, atol=1e-6)


def test_cloudpickle_round_trip_locally_and_on_an_executor(export_dir, sc):
    net = TFNet.from_export_folder(export_dir)
    expected = net.forward(X)
    clone = cloudpickle.loads(cloudpickle.dumps(net))
    assert isinstance(clone, TFNet) and clone.name == net.name
    assert clone.input_names == net.input_names and clone.output_names == net.output_names
    np.testing.assert_array_equal(clone.forward(X), expected)
    remote = sc.parallelize([X, X[:3]], 2).map(lambda x: (os.getpid(), net.forward(x))).collect()
    assert os.getpid() not in [pid for pid, _ in remote]
    np.testing.assert_allclose(remote[0][1], expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(remote[1][1], expected[:3], rtol=1e-6, atol=1e-6)


def test_frozen_layer_between_trainable_stem_and_head_trains_with_fit(model, export_dir, tmp_path):
    keras.utils.set_random_seed(3)
    net = TFNet.from_export_folder(export_dir)
    graph_before = net.graph_def.SerializeToString(deterministic=True)
    inputs = keras.Input((4,))
    stem = keras.layers.Dense(4, name="stem")
    head = keras.layers.Dense(1, name="head")
    combined = keras.Model(inputs, head(net(stem(inputs))))
    assert combined.layers[2] is net and net.trainable_weights == []
    assert {w.path.split("/")[0] for w in combined.trainable_weights} == {"stem", "head"}

    x = RNG.normal(size=(64, 4)).astype("float32")
    y = (x.sum(axis=1, keepdims=True) > 0).astype("float32")
    stem_before, head_before = stem.get_weights()[0].copy(), head.get_weights()[0].copy()
    combined.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
    history = combined.fit(x, y, epochs=8, batch_size=16, verbose=0).history["loss"]
    assert history[-1] < history[0]
    assert not np.allclose(stem.get_weights()[0], stem_before)
    assert not np.allclose(head.get_weights()[0], head_before)
    assert net.graph_def.SerializeToString(deterministic=True) == graph_before

    path = str(tmp_path / "combined.keras")
    combined.save(path)
    restored = keras.models.load_model(path)
    assert isinstance(restored.layers[2], TFNet)
    np.testing.assert_allclose(restored.predict(x, verbose=0), combined.predict(x, verbose=0), rtol=1e-5, atol=1e-6)


def test_graph_of_unknown_rank_gets_shapes_from_its_keras_inputs():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, name="x")  # no shape at all, as in many TF1 graphs
        tf.identity(x * 3.0, name="y")
    net = TFNet.from_frozen_graph(graph.as_graph_def(), ["x"], ["y"])
    assert net.output_specs[0].shape.rank is None
    inputs = keras.Input((4,))
    hidden = net(inputs)
    assert tuple(hidden.shape) == (None, 4)
    assert net.compute_output_shape((None, 4)) == (None, 4)
    model = keras.Model(inputs, keras.layers.Dense(2)(hidden))
    assert model.predict(X, verbose=0).shape == (9, 2)


def test_get_config_round_trip_and_model_payload(export_dir):
    from sparktf.models.payload import ModelPayload

    net = TFNet.from_export_folder(export_dir)
    config = keras.saving.serialize_keras_object(net)
    assert config["registered_name"] == "sparktf>TFNet"
    clone = keras.saving.deserialize_keras_object(json.loads(json.dumps(config)))
    np.testing.assert_array_equal(clone.forward(X), net.forward(X))

    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(1)(net(inputs)))
    rebuilt = ModelPayload.from_bytes(ModelPayload.from_model(model).to_bytes()).build()
    np.testing.assert_allclose(rebuilt.predict(X, verbose=0), model.predict(X, verbose=0), rtol=1e-6, atol=1e-6)


def test_distributed_predict_over_uneven_partitions_keeps_order_and_count(export_dir, sc):
    net = TFNet.from_export_folder(export_dir)
    x = RNG.normal(size=(20, 4)).astype("float32")
    kept = [0] + list(range(6, 20))  # partitions of range(20) are 0-5, 6-12, 13-19: keeps 1, 7 and 7 records
    rdd = sc.parallelize(range(20), 3).filter(lambda i: i in kept).map(lambda i: x[i])
    partitions = net.predict(rdd, batch_per_thread=5).glom().collect()
    assert [len(p) for p in partitions] == [1, 7, 7]
    rows = [row for partition in partitions for row in partition]
    assert len(rows) == 15 and all(r.shape == (2,) for r in rows)
    np.testing.assert_allclose(np.stack(rows), net.forward(x[kept]), rtol=1e-6, atol=1e-6)


def test_distributed_arrays_give_an_rdd_of_records_in_order(export_dir, two_heads_dir, sc):
    net = TFNet.from_export_folder(export_dir)
    x = RNG.normal(size=(7, 4)).astype("float32")
    rdd = net.predict(x, batch_per_thread=3, distributed=True)
    assert rdd.getNumPartitions() == sc.defaultParallelism
    rows = rdd.collect()
    assert len(rows) == 7 and all(r.shape == (2,) for r in rows)
    np.testing.assert_allclose(np.stack(rows), net.forward(x), rtol=1e-6, atol=1e-6)

    two_heads = TFNet.from_saved_model(two_heads_dir, inputs=["zeta", "alpha"])
    zeta, alpha = RNG.normal(size=(5, 3)).astype("float32"), RNG.normal(size=(5, 2)).astype("float32")
    pairs = two_heads.predict([zeta, alpha], batch_per_thread=2, distributed=True).collect()
    np.testing.assert_allclose(np.stack([p[1] for p in pairs]), two_heads.forward([zeta, alpha])[1], rtol=1e-6, atol=1e-6)
    with pytest.raises(DataError, match="rank-0 input"):
        net.predict(np.float32(1.0), distributed=True)
    with pytest.raises(DataError, match=r"takes 1 input\(s\).*got 2"):
        net.predict([x, x], distributed=True)


def test_distributed_batch_the_graph_rejects_names_partition_and_records(sc):
    doubled_if_finite = tf.function(lambda x: tf.debugging.assert_all_finite(x, "not finite") * 2.0)
    finite = TFNet.from_function(doubled_if_finite, [tf.TensorSpec([None], tf.float32)])
    x = np.arange(8, dtype="float32")
    np.testing.assert_array_equal(np.stack(finite.predict(x, distributed=True).collect()), x * 2)
    x[6] = np.nan  # partition 1 holds records 4..7, in batches of 2: the batch 6..7 (2..3 within the partition)
    rejected = r"partition 1, records 2\.\.3: the graph rejected the batch \(InvalidArgumentError"
    with pytest.raises(DataError, match=rejected):
        finite.predict(x, batch_per_thread=2, distributed=True).collect()


def test_distributed_predict_multi_io_rdd_and_tfdataset(two_heads_dir, sc):
    from sparktf.dataset import TFDataset

    net = TFNet.from_saved_model(two_heads_dir, inputs=["zeta", "alpha"])
    zeta = RNG.normal(size=(11, 3)).astype("float32")
    alpha = RNG.normal(size=(11, 2)).astype("float32")
    prod, total = net.forward([zeta, alpha])
    rows = net.predict(sc.parallelize([[z, a] for z, a in zip(zeta, alpha)], 3), batch_per_thread=2).collect()
    assert len(rows) == 11
    np.testing.assert_allclose(np.stack([r[0] for r in rows]), prod, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.stack([r[1] for r in rows]), total, rtol=1e-6, atol=1e-6)

    row_sums = TFNet.from_function(
        tf.function(lambda x: tf.reduce_sum(x, axis=1)), [tf.TensorSpec([None, None], tf.int64)]
    )
    rdd = sc.parallelize([[1, 2, 3], [4, 5, 6], [7, 8, 9]], 2)  # record length comes from the first record
    assert [int(r) for r in row_sums.predict(rdd).collect()] == [6, 15, 24]

    dataset = TFDataset.from_ndarrays((zeta, alpha), batch_per_thread=4, shuffle=False)
    with pytest.raises(DataError, match="1 feature tensor.*takes 2 input"):
        net.predict(dataset)
    dataset = TFDataset.from_ndarrays([zeta, alpha], batch_per_thread=4, shuffle=False)
    rows = net.predict(dataset).collect()
    np.testing.assert_allclose(np.stack([r[1] for r in rows]), total, rtol=1e-6, atol=1e-6)
