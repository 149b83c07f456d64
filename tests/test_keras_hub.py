"""Keras Hub tasks with their preprocessors: a text classifier and a causal LM fine-tuned, evaluated, scored and
generating on Spark as ``Task.fit``, ``evaluate``, ``predict`` and ``generate`` in one process. Tiny models built
from config, vocabularies made here: nothing is downloaded."""

import keras
import numpy as np
import pytest

from sparktf import MaxIteration, TFDataset, TFOptimizer, TFPredictor
from sparktf.errors import DataError
from sparktf.spark.classic_session import SHARE_FILE_BYTES_CONF, FileShare

keras_hub = pytest.importorskip("keras_hub")

WORDS = ["good", "great", "fine", "bad", "awful", "poor", "the", "movie", "was", "plot"]
BERT_VOCABULARY = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS
ROWS = 32


def _reviews(seed=0):
    rng = np.random.default_rng(seed)
    texts, labels = [], []
    for _ in range(ROWS):
        words = list(rng.choice(WORDS[6:], 3)) + [WORDS[int(rng.integers(0, 6))]]
        rng.shuffle(words)
        texts.append(" ".join(words))
        labels.append(int(any(word in WORDS[:3] for word in words)))
    return texts, labels


def _classifier(seed=3):
    keras.utils.set_random_seed(seed)
    tokenizer = keras_hub.models.BertTokenizer(vocabulary=BERT_VOCABULARY)
    preprocessor = keras_hub.models.BertTextClassifierPreprocessor(tokenizer, sequence_length=8)
    backbone = keras_hub.models.BertBackbone(vocabulary_size=len(BERT_VOCABULARY), num_layers=2, num_heads=2,
                                             hidden_dim=32, intermediate_dim=64, max_sequence_length=8, dropout=0.0)
    classifier = keras_hub.models.BertTextClassifier(backbone, num_classes=2, preprocessor=preprocessor, dropout=0.0)
    classifier.compile(optimizer=keras.optimizers.SGD(0.5))
    return classifier


def test_a_text_classifier_fine_tunes_evaluates_and_scores_a_text_column_as_task_fit(spark, tmp_path):
    texts, labels = _reviews()
    frame = spark.createDataFrame(list(zip(texts, labels)), "text string, label long").repartition(2).cache()
    rows = frame.collect()  # the frame's own order
    x, y = np.array([row["text"] for row in rows]), np.array([row["label"] for row in rows])

    reference, classifier = _classifier(), _classifier()
    reference.fit(x, y, batch_size=ROWS, epochs=3, shuffle=False, verbose=0)  # full batches: order-free
    dataset = TFDataset.from_dataframe(frame, "text", "label", batch_size=ROWS)
    optimizer = TFOptimizer.from_keras(classifier, dataset)
    history = optimizer.optimize(MaxIteration(3))
    np.testing.assert_allclose(history["loss"], reference.history.history["loss"], atol=1e-5)
    for got, want in zip(classifier.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, atol=1e-5)
    scores = optimizer.evaluate(batch_per_thread=5)
    assert scores == pytest.approx(reference.evaluate(x, y, verbose=0, return_dict=True), abs=1e-5)

    expected = reference.predict(x, verbose=0)
    classifier.save_to_preset(str(tmp_path / "preset"))  # reloaded from a local preset: same predictions
    reloaded = keras_hub.models.TextClassifier.from_preset(str(tmp_path / "preset"))
    spark.sparkContext.setLocalProperty(SHARE_FILE_BYTES_CONF, "1k")  # a model this big travels as a file
    try:
        reloaded_predictor = TFPredictor.from_keras(reloaded, TFDataset.from_dataframe(frame, "text",
                                                                                      batch_per_thread=5))
    finally:
        spark.sparkContext.setLocalProperty(SHARE_FILE_BYTES_CONF, None)
    assert isinstance(reloaded_predictor._model.handle.broadcast, FileShare)
    scored = reloaded_predictor.predict_dataframe(frame, "text").select("prediction").collect()
    np.testing.assert_allclose([row["prediction"] for row in scored], expected, atol=1e-5)


def _causal_lm(seed=5):
    from tiny_lms import gpt2_lm

    return gpt2_lm(seed)


def test_a_causal_lm_fine_tunes_as_fit_and_generates_as_generate_on_a_dataframe_and_a_stream(spark, tmp_path):
    prompts = ["a b", "ab c", "c a b", "b", "a a", "c c b", "ab ab", "b c"]
    frame = spark.createDataFrame([(p,) for p in prompts], "prompt string").repartition(2).cache()
    ordered = [row["prompt"] for row in frame.collect()]

    reference, lm = _causal_lm(), _causal_lm()
    reference.fit(np.array(ordered), batch_size=len(prompts), epochs=2, shuffle=False, verbose=0)
    dataset = TFDataset.from_dataframe(frame, "prompt", batch_size=len(prompts))  # no labels: the preprocessor's
    history = TFOptimizer.from_keras(lm, dataset).optimize(MaxIteration(2))
    np.testing.assert_allclose(history["loss"], reference.history.history["loss"], atol=1e-5)
    for got, want in zip(lm.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, atol=1e-5)

    expected = [str(text) for text in reference.generate(ordered, max_length=8, stop_token_ids=None)]
    generating = TFPredictor.from_keras(lm, TFDataset.from_dataframe(frame, "prompt", batch_per_thread=3),
                                        method="generate", max_length=8, stop_token_ids=None)
    assert generating.predict().collect() == expected  # predict_dataframe's string column: the example's test
    assert dict(generating.predict_dataframe(frame, "prompt", output_col="completion").dtypes)["completion"] == \
        "string"
    frame.write.parquet(str(tmp_path / "prompts"))  # the same prompts as a file stream
    stream = spark.readStream.schema("prompt string").parquet(str(tmp_path / "prompts"))
    query = (generating.predict_dataframe(stream, "prompt", output_col="completion").writeStream.format("memory")
             .queryName("generated_stream").trigger(availableNow=True).start())
    query.awaitTermination(300)
    assert query.exception() is None, query.exception()
    streamed = {row["prompt"]: row["completion"] for row in spark.sql("select * from generated_stream").collect()}
    assert streamed == dict(zip(ordered, expected))


def test_generation_and_maps_are_refused_clearly_and_a_rejected_record_names_its_partition(spark):
    import tensorflow as tf

    frame = spark.createDataFrame([("a",)], "prompt string")
    dataset = TFDataset.from_dataframe(frame, "prompt", batch_per_thread=2)
    with pytest.raises(DataError, match="generate"):
        TFPredictor.from_keras(_classifier(), dataset, method="generate", max_length=4)
    with pytest.raises(DataError, match=r"(?s)batch map .*failed.*no attribute .broken"):
        dataset.map(lambda text: text.broken)
    numbers = spark.createDataFrame([("1.5",), ("2",), ("three",), ("4",)], "text string").coalesce(1)
    parsed = TFDataset.from_dataframe(numbers, "text", batch_per_thread=2).map(
        lambda text: tf.reshape(tf.strings.to_number(text), [-1, 1]))
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    with pytest.raises(Exception, match=r"(?s)partition 0, records 2\.\.3: the model rejected.*batch maps rejected"):
        TFPredictor.from_keras(model, parsed).predict().collect()


def test_lora_enabled_after_building_travels_with_the_model_and_only_the_adapters_train():
    from sparktf.models.payload import ModelPayload

    texts, labels = _reviews(seed=1)
    x, y = np.array(texts), np.array(labels)
    classifier = _classifier()
    classifier.backbone.enable_lora(2)  # after the layers were made: their config does not say so
    classifier.compile(optimizer=keras.optimizers.SGD(0.5))
    rebuilt = ModelPayload.from_bytes(ModelPayload.from_model(classifier).to_bytes()).build()  # as a worker does
    paths = [v.path for v in classifier.trainable_variables]
    assert [v.path for v in rebuilt.trainable_variables] == paths and any("lora" in path for path in paths)
    assert len(paths) < len(classifier.weights) / 2  # the backbone frozen: its gradients are neither computed nor sent
    for model in (classifier, rebuilt):
        model.fit(x, y, batch_size=ROWS, epochs=2, shuffle=False, verbose=0)
    for got, want in zip(rebuilt.get_weights(), classifier.get_weights()):
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_a_task_on_an_executor_without_keras_hub_names_the_extra_to_install(tmp_path):
    import subprocess
    import sys

    from sparktf.models.payload import ModelPayload

    path = tmp_path / "payload.bin"
    path.write_bytes(ModelPayload.from_model(_classifier(), include_weights=False).to_bytes())
    program = (  # an executor's Python where keras_hub cannot be imported
        "import sys; sys.modules['keras_hub'] = None\n"
        "from sparktf.errors import ModelError\n"
        "from sparktf.models.payload import ModelPayload\n"
        f"data = open({str(path)!r}, 'rb').read()\n"
        "try:\n    ModelPayload.from_bytes(data).build()\n"
        "except ModelError as error:\n    print('ModelError:', error)\n"
    )
    output = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300).stdout
    assert "ModelError: the model is a BertTextClassifier from 'keras_hub'" in output
    assert "pip install 'sparktf[hub]'" in output


def test_an_image_classifier_and_a_backbone_for_embeddings_score_as_in_one_process(spark):
    import tensorflow as tf

    keras.utils.set_random_seed(7)
    rng = np.random.default_rng(7)
    images = rng.integers(0, 256, size=(12, 8, 8, 3)).astype(np.float32)
    frame = spark.createDataFrame([(image.ravel().tolist(),) for image in images], "pixels array<float>")
    converter = keras_hub.layers.ResNetImageConverter(image_size=(8, 8), scale=1 / 255.0)
    backbone = keras_hub.models.ResNetBackbone(
        input_conv_filters=[64], input_conv_kernel_sizes=[3], stackwise_num_filters=[64], stackwise_num_blocks=[1],
        stackwise_num_strides=[1], block_type="basic_block", image_shape=(8, 8, 3))
    classifier = keras_hub.models.ResNetImageClassifier(
        backbone, num_classes=3, preprocessor=keras_hub.models.ResNetImageClassifierPreprocessor(converter))
    # a flat array column to images on the workers, then the task's own preprocessor (resizing, rescaling)
    dataset = TFDataset.from_dataframe(frame, "pixels", batch_per_thread=5).map(lambda x: tf.reshape(x, [-1, 8, 8, 3]))
    got = np.stack(TFPredictor.from_keras(classifier, dataset).predict().collect())
    np.testing.assert_allclose(got, classifier.predict(images, verbose=0), atol=1e-5)

    tokenizer = keras_hub.models.BertTokenizer(vocabulary=BERT_VOCABULARY)  # a backbone alone: the map tokenizes
    packer = keras_hub.models.BertTextClassifierPreprocessor(tokenizer, sequence_length=8)
    bert = _classifier().backbone
    texts, _ = _reviews()
    frame = spark.createDataFrame([(text,) for text in texts[:10]], "text string")
    dataset = TFDataset.from_dataframe(frame, "text", batch_per_thread=4).map(packer)
    pooled = [row["pooled_output"] for row in TFPredictor.from_keras(bert, dataset).predict().collect()]
    np.testing.assert_allclose(np.stack(pooled), bert.predict(packer(np.array(texts[:10])), verbose=0)
                               ["pooled_output"], atol=1e-5)


def test_a_functional_model_calling_a_tokenizer_is_refused_on_the_driver_as_keras_cannot_rebuild_it(spark):
    from sparktf.errors import ModelError

    texts, labels = _reviews()
    frame = spark.createDataFrame(list(zip(texts, labels)), "text string, label long")
    preprocessor = _classifier().preprocessor
    backbone = keras_hub.models.BertBackbone(vocabulary_size=len(BERT_VOCABULARY), num_layers=1, num_heads=2,
                                             hidden_dim=16, intermediate_dim=32, max_sequence_length=8)
    text = keras.Input((), dtype="string")
    model = keras.Model(text, keras.layers.Dense(1)(backbone(preprocessor(text))["pooled_output"]))
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ModelError, match=r"cannot be rebuilt on the executors: its graph calls "
                                         r"\['bert_text_classifier_preprocessor.*TFDataset.map"):
        TFOptimizer.from_keras(model, TFDataset.from_dataframe(frame, "text", "label", batch_size=8))
