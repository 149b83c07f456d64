"""sparktf.ml: KerasEstimator / KerasModel in Pipelines, validators in parallel, save/load, evaluators and errors."""

import os

import keras
import numpy as np
import pytest
from pyspark.ml import Pipeline, PipelineModel
from pyspark.ml.evaluation import BinaryClassificationEvaluator, MulticlassClassificationEvaluator
from pyspark.ml.feature import StringIndexer, VectorAssembler
from pyspark.ml.functions import array_to_vector
from pyspark.ml.linalg import Vector
from pyspark.ml.tuning import ParamGridBuilder, TrainValidationSplit
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sparktf.errors import DataError
from sparktf.ml import KerasEstimator, KerasModel

SPECIES = ("setosa", "versicolor", "virginica")
MEASURES = ["sepal_length", "sepal_width", "petal_length", "petal_width"]


@pytest.fixture(scope="module")
def flowers(spark):
    """120 rows of three well separated classes: four numeric columns, a string label and an id."""
    rng = np.random.default_rng(0)
    centers = np.array([[0.0, 0.0, 0.0, 0.0], [3.0, 3.0, 0.0, 0.0], [0.0, 3.0, 3.0, 3.0]])
    rows = [(i, *map(float, centers[i % 3] + rng.normal(scale=0.5, size=4)), SPECIES[i % 3]) for i in range(120)]
    return spark.createDataFrame(rows, ["id", *MEASURES, "species"]).repartition(2).cache()


@pytest.fixture(scope="module")
def indexed(flowers):
    """``flowers`` with a ``features`` Vector (VectorAssembler) and a ``label`` index (StringIndexer)."""
    assembled = VectorAssembler(inputCols=MEASURES, outputCol="features").transform(flowers)
    return StringIndexer(inputCol="species", outputCol="label").fit(assembled).transform(assembled).cache()


def _classifier(classes=3, inputs=4, loss="sparse_categorical_crossentropy", activation="softmax"):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((inputs,), name="features"), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(classes, activation=activation)])
    model.compile(keras.optimizers.Adam(0.05), loss, metrics=["accuracy"])
    return model


def _no_job_runs(sc, action):
    """Run ``action`` (expected to raise DataError) and check that it started no Spark job; return the error."""
    jobs_before = sc.statusTracker().getJobIdsForGroup()
    with pytest.raises(DataError) as error:
        action()
    assert sc.statusTracker().getJobIdsForGroup() == jobs_before
    return str(error.value)


def test_pipeline_fits_scores_evaluates_and_round_trips(spark, flowers, tmp_path):
    model = _classifier()
    weights_before = [w.copy() for w in model.get_weights()]
    estimator = KerasEstimator(model=model, epochs=2, batchSize=8, learningRate=0.1, validationFraction=0.25)
    pipeline = Pipeline(stages=[VectorAssembler(inputCols=MEASURES, outputCol="features"),
                                StringIndexer(inputCol="species", outputCol="label"), estimator])
    fitted = pipeline.fit(flowers)

    # the user's model is untouched: same weights, optimizer never stepped
    assert all(np.array_equal(a, b) for a, b in zip(weights_before, model.get_weights()))
    assert int(model.optimizer.iterations.numpy()) == 0
    stage = fitted.stages[-1]
    assert isinstance(stage, KerasModel) and stage.keras_model is not model
    assert stage.keras_model.optimizer.learning_rate.numpy() == pytest.approx(0.1)
    assert len(stage.history["loss"]) == 2 and len(stage.history["val_accuracy"]) == 2
    assert len(stage.history["accuracy"]) == 2  # the compiled metric per epoch, as fit's History

    scored = fitted.transform(flowers).cache()
    assert scored.columns == flowers.columns + ["features", "label", "prediction", "probability"]
    assert scored.schema["prediction"].dataType == T.DoubleType()
    rows = scored.orderBy("id").collect()
    assert len(rows) == flowers.count()
    assert isinstance(rows[0]["probability"], Vector) and sum(rows[0]["probability"]) == pytest.approx(1, abs=1e-5)
    assert MulticlassClassificationEvaluator(metricName="accuracy").evaluate(scored) > 0.85
    scored.unpersist()

    path = str(tmp_path / "pipeline")
    fitted.write().overwrite().save(path)
    reloaded = PipelineModel.load(path)
    again = reloaded.transform(flowers).orderBy("id").collect()
    assert [r["prediction"] for r in again] == [r["prediction"] for r in rows]
    np.testing.assert_allclose([r["probability"].toArray() for r in again],
                               [r["probability"].toArray() for r in rows], rtol=1e-5)

    stage_dir = os.path.join(path, "stages", sorted(os.listdir(os.path.join(path, "stages")))[-1])
    fresh = KerasModel.load(stage_dir)  # the .keras file beside the JSON metadata, no pickle
    assert fresh.uid == stage.uid and fresh.history == stage.history and fresh.getTask() == "classification"
    assert all(np.array_equal(a, b) for a, b in zip(fresh.keras_model.get_weights(), stage.keras_model.get_weights()))
    assert keras.saving.load_model(os.path.join(stage_dir, "model.keras")).count_params() == model.count_params()


def test_a_validator_trains_in_parallel_and_chooses_as_a_serial_run(indexed, caplog):
    """TrainValidationSplit(parallelism=2) on local[2] (CrossValidator's path too: fitMultiple): two models
    train at once, each on 1 worker (numWorkers unset: the free slots over trialParallelism); every metric and
    the chosen model equal a serial run on 1 worker."""
    import logging

    metrics, best_params = [], []
    for parallelism, workers in ((2, None), (1, 1)):
        estimator = KerasEstimator(model=_classifier(), batchSize=16, numWorkers=workers, trialParallelism=parallelism)
        grid = ParamGridBuilder().addGrid(estimator.learningRate, [0.003, 0.05]).build()
        validator = TrainValidationSplit(estimator=estimator, estimatorParamMaps=grid, parallelism=parallelism,
                                         evaluator=MulticlassClassificationEvaluator(metricName="logLoss"), seed=1)
        with caplog.at_level(logging.INFO, logger="sparktf.ml.estimator"):
            best = validator.fit(indexed)
        metrics.append(best.validationMetrics)
        best_params.append(best.bestModel.keras_model.optimizer.learning_rate.numpy())
        assert isinstance(best.bestModel, KerasModel) and best.bestModel.transform(indexed).count() == indexed.count()
        assert estimator.getLearningRate() is None  # the grid's values went to copies
    assert "2 models, 2 at a time, each on 1 workers" in caplog.text
    np.testing.assert_allclose(metrics[0], metrics[1], atol=1e-6)
    assert metrics[0][0] != pytest.approx(metrics[0][1], abs=1e-3)  # the choice means something
    np.testing.assert_allclose(best_params[0], best_params[1], atol=1e-9)


def test_trial_parallelism_sizes_each_model_the_same_alone_in_a_pipeline_or_under_any_validator(indexed):
    estimator = KerasEstimator(model=_classifier(), trialParallelism=2)  # local[2]: 2 slots
    pipeline = Pipeline(stages=[estimator])  # what a Pipeline fits is the estimator, with its Params
    assert [stage._trial_workers(indexed) for stage in pipeline.getStages()] == [1]
    assert KerasEstimator(model=_classifier(), trialParallelism=4)._trial_workers(indexed) == 1  # at least 1
    assert KerasEstimator(model=_classifier(), trialParallelism=2, numWorkers=2)._trial_workers(indexed) is None
    assert KerasEstimator(model=_classifier())._trial_workers(indexed) is None  # every slot: numWorkers' default
    with pytest.raises(DataError, match="trialParallelism=0 is out of range"):
        KerasEstimator(model=_classifier(), trialParallelism=0).fit(indexed)


def test_regression_predicts_a_double_and_wider_outputs_an_array(spark, sc):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(64, 3))
    rows = [(r.tolist(), float(r @ [1.0, -2.0, 0.5]), i % 3) for i, r in enumerate(x)]
    df = spark.createDataFrame(rows, "x array<double>, y double, w int")
    keras.utils.set_random_seed(0)
    regressor = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    regressor.compile(keras.optimizers.SGD(0.1), "mse")
    fitted = KerasEstimator(model=regressor, featuresCol="x", labelCol="y", weightCol="w", epochs=2,
                            batchSize=8).fit(df)  # rows weighted 0, 1 and 2
    assert fitted.getTask() == "regression"
    scored = fitted.transform(df)
    assert scored.columns == ["x", "y", "w", "prediction"] and scored.schema["prediction"].dataType == T.DoubleType()
    assert scored.count() == 64

    wide = KerasModel.from_keras(keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]), featuresCol="x")
    jobs_before = sc.statusTracker().getJobIdsForGroup()
    lazy = wide.transform(df)  # a lazy transformation: no job until an action
    assert sc.statusTracker().getJobIdsForGroup() == jobs_before
    assert lazy.schema["prediction"].dataType == T.ArrayType(T.FloatType(), False)
    assert len(lazy.first()["prediction"]) == 2


def test_two_input_model_takes_one_column_per_input(spark):
    rng = np.random.default_rng(2)
    rows = [(rng.normal(size=2).tolist(), float(rng.normal()), i % 2) for i in range(48)]
    df = spark.createDataFrame(rows, "pair array<double>, scalar double, label int")
    df = df.withColumn("pair_vector", array_to_vector("pair"))
    keras.utils.set_random_seed(0)
    pair, scalar = keras.Input((2,), name="pair_vector"), keras.Input((), name="scalar")
    joined = keras.layers.Concatenate()([pair, keras.layers.Reshape((1,))(scalar)])
    model = keras.Model([pair, scalar], keras.layers.Dense(1, activation="sigmoid")(joined))
    model.compile("adam", "binary_crossentropy")
    estimator = KerasEstimator(model=model, featureCols=["pair_vector", "scalar"], epochs=1, batchSize=8)
    scored = estimator.fit(df).transform(df).withColumn("label", F.col("label").cast("double")).cache()
    assert scored.columns == df.columns + ["prediction", "probability"]
    assert {r["prediction"] for r in scored.collect()} <= {0.0, 1.0}
    assert 0 <= BinaryClassificationEvaluator(rawPredictionCol="probability").evaluate(scored) <= 1
    scored.unpersist()


def test_wrapped_models_save_and_load_and_logits_become_probabilities(spark, indexed, tmp_path):
    logits = _classifier(activation=None, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    wrapped = KerasModel.from_keras(logits, batchSize=7)
    assert wrapped.getTask() == "classification" and wrapped.getFromLogits()
    rows = wrapped.transform(indexed).orderBy("id").collect()
    assert all(sum(r["probability"]) == pytest.approx(1, abs=1e-5) for r in rows)
    assert [r["prediction"] for r in rows] == [float(np.argmax(r["probability"].toArray())) for r in rows]

    softmax = keras.Sequential([logits, keras.layers.Softmax()])
    softmax.export(str(tmp_path / "exported"), verbose=False)
    served = KerasModel.from_saved_model(str(tmp_path / "exported"), task="classification")
    served.write().overwrite().save(str(tmp_path / "served_stage"))
    reloaded = KerasModel.load(str(tmp_path / "served_stage"))
    assert reloaded.keras_model is None
    served_rows = reloaded.transform(indexed).orderBy("id").collect()
    np.testing.assert_allclose([r["probability"].toArray() for r in served_rows],
                               [r["probability"].toArray() for r in rows], rtol=1e-4, atol=1e-6)


def test_estimator_saves_and_loads_alone_and_in_a_pipeline(tmp_path):
    model = _classifier()
    estimator = KerasEstimator(model=model, epochs=4, featuresCol="f", learningRate=0.01, callbacks=[], weightCol="w")
    estimator.write().overwrite().save(str(tmp_path / "estimator"))
    loaded = KerasEstimator.load(str(tmp_path / "estimator"))
    assert loaded.uid == estimator.uid and KerasEstimator().getWeightCol() is None
    assert (loaded.getEpochs(), loaded.getFeaturesCol(), loaded.getLearningRate(), loaded.getWeightCol()) == (
        4, "f", 0.01, "w")
    assert loaded.getCallbacks() == [] and not loaded.isSet(loaded.batchSize)
    assert all(np.array_equal(a, b) for a, b in zip(model.get_weights(), loaded.getModel().get_weights()))

    Pipeline(stages=[estimator]).write().overwrite().save(str(tmp_path / "pipeline"))
    (stage,) = Pipeline.load(str(tmp_path / "pipeline")).getStages()
    assert isinstance(stage, KerasEstimator) and stage.getModel().compiled


def test_wrong_columns_labels_and_models_fail_before_any_job(sc, indexed):
    model = _classifier()
    fit = lambda **params: KerasEstimator(model=model, **params).fit(indexed)  # noqa: E731
    assert "featuresCol column 'nope' is not in the DataFrame" in _no_job_runs(sc, lambda: fit(featuresCol="nope"))
    message = _no_job_runs(sc, lambda: fit(featuresCol="species"))
    assert "'species' is string" in message and "takes numbers" in message
    assert "takes a Vector or array column" in _no_job_runs(sc, lambda: fit(featuresCol="sepal_length"))
    message = _no_job_runs(sc, lambda: KerasEstimator(model=_classifier(inputs=5)).fit(indexed))
    assert "vectors of size 4" in message and "takes 5 values" in message
    assert "index text labels first (StringIndexer)" in _no_job_runs(sc, lambda: fit(labelCol="species"))
    message = _no_job_runs(sc, lambda: KerasEstimator(model=_classifier(classes=2)).fit(indexed))
    assert "3 classes" in message and "give the last layer 3 units" in message
    message = _no_job_runs(sc, lambda: fit(labelCol="features"))
    assert "labelCol column 'features' is vector" in message and "one class index per row" in message
    uncompiled = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    assert "is not compiled" in _no_job_runs(sc, lambda: KerasEstimator(model=uncompiled).fit(indexed))
    assert "epochs=0 is out of range" in _no_job_runs(sc, lambda: fit(epochs=0))
    assert "weightCol 'nope' is not a column of the DataFrame" in _no_job_runs(sc, lambda: fit(weightCol="nope"))
    assert "weightCol 'species' has type string" in _no_job_runs(sc, lambda: fit(weightCol="species"))
    wrapped = KerasModel.from_keras(model)
    assert "pick another predictionCol" in _no_job_runs(sc, lambda: wrapped.transform(indexed.withColumn(
        "prediction", F.lit(1))))
