"""A Spark ML Pipeline with a Keras model: tune, evaluate, save, load and score iris flowers.

Uses Fisher's iris table, shipped in ``examples/data`` (nothing is downloaded):

1. puts it into a DataFrame with four numeric columns and a string ``species``;
2. builds a ``Pipeline`` of ``VectorAssembler`` -> ``StringIndexer`` ->
   :class:`sparktf.ml.KerasEstimator` (a small Keras classifier trained by
   sparktf on Spark barrier tasks);
3. tunes the number of epochs with ``CrossValidator`` + ``ParamGridBuilder``
   and measures the best pipeline's accuracy on held-out rows with
   ``MulticlassClassificationEvaluator``;
4. saves the fitted ``PipelineModel`` (the Keras model as a ``.keras`` file
   beside Spark's metadata), loads it back and scores the held-out rows again.

    spark-submit examples/ml_pipeline.py --model_dir /models/iris-pipeline
"""

from __future__ import annotations

import os
import tempfile
from typing import Dict, List, Optional, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
from pyspark.ml import Pipeline, PipelineModel
from pyspark.ml.evaluation import MulticlassClassificationEvaluator
from pyspark.ml.feature import StringIndexer, VectorAssembler
from pyspark.ml.tuning import CrossValidator, ParamGridBuilder
from pyspark.sql import DataFrame, SparkSession
from bundled_data import load_iris
from example_support import example_parser, start_spark
from sparktf.ml import KerasEstimator

MEASURES = ["sepal_length", "sepal_width", "petal_length", "petal_width"]


def iris_dataframe(spark: SparkSession) -> DataFrame:
    """The 150 iris flowers: four measures in cm and the species as text."""
    return spark.createDataFrame(load_iris(), [*MEASURES, "species"])


def build_classifier(learning_rate: float) -> keras.Model:
    """A small softmax classifier of the four measures, compiled for class indices."""
    model = keras.Sequential([
        keras.Input((len(MEASURES),), name="features"),
        keras.layers.Normalization(mean=[5.8, 3.1, 3.8, 1.2], variance=[0.7, 0.2, 3.1, 0.6]),
        keras.layers.Dense(16, activation="relu"),
        keras.layers.Dense(3, activation="softmax"),
    ])
    model.compile(keras.optimizers.Adam(learning_rate), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def tune(train: DataFrame, estimator: KerasEstimator, epochs: List[int], folds: int) -> PipelineModel:
    """The Pipeline refitted on all of ``train`` with the epochs that cross-validate best."""
    pipeline = Pipeline(stages=[VectorAssembler(inputCols=MEASURES, outputCol="features"),
                                StringIndexer(inputCol="species", outputCol="label"), estimator])
    grid = ParamGridBuilder().addGrid(estimator.epochs, epochs).build()
    validator = CrossValidator(estimator=pipeline, estimatorParamMaps=grid, numFolds=folds, seed=7,
                               evaluator=MulticlassClassificationEvaluator(metricName="accuracy"))
    tuned = validator.fit(train)
    for params, accuracy in zip(grid, tuned.avgMetrics):
        print(f"epochs={params[estimator.epochs]}: cross-validated accuracy {accuracy:.3f}")
    return tuned.bestModel


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, object]:
    """Tune, evaluate, save and reload; returns the accuracies, the model path and the best epochs."""
    parser = example_parser(__doc__.splitlines()[0])
    parser.add_argument("--epochs", default="20,60", help="comma-separated epochs to cross-validate")
    parser.add_argument("--folds", type=int, default=3, help="CrossValidator's numFolds")
    parser.add_argument("--batch_size", type=int, default=16, help="global training batch")
    parser.add_argument("--learning_rate", type=float, default=0.01)
    parser.add_argument("--model_dir", default=None, help="where the PipelineModel is saved (default: a temp dir)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.epochs, args.folds = "1,3", 2
    spark = start_spark(args, "sparktf-ml-pipeline")

    train, test = iris_dataframe(spark).randomSplit([0.8, 0.2], seed=3)
    estimator = KerasEstimator(model=build_classifier(args.learning_rate), batchSize=args.batch_size,
                               numWorkers=args.num_workers)
    best = tune(train.cache(), estimator, [int(e) for e in args.epochs.split(",")], args.folds)
    evaluator = MulticlassClassificationEvaluator(metricName="accuracy")
    accuracy = evaluator.evaluate(best.transform(test))
    best_epochs = len(best.stages[-1].history["loss"])
    print(f"best: {best_epochs} epochs, held-out accuracy {accuracy:.3f}")

    path = args.model_dir or os.path.join(tempfile.mkdtemp(prefix="sparktf-ml-pipeline-"), "iris")
    best.write().overwrite().save(path)
    scored = PipelineModel.load(path).transform(test)
    reloaded_accuracy = evaluator.evaluate(scored)
    print(f"saved to {path}; reloaded, held-out accuracy {reloaded_accuracy:.3f}")
    scored.select("species", "label", "prediction", "probability").show(5, truncate=False)
    return {"accuracy": accuracy, "reloaded_accuracy": reloaded_accuracy, "model_dir": path,
            "best_epochs": best_epochs, "columns": scored.columns}


if __name__ == "__main__":
    main()
