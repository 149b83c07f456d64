"""Batch inference with a SavedModel: Parquet in, predictions to Parquet, and an RDD pipeline.

1. reads ``--input`` (Parquet with an array column ``--feature_col``),
   appends the SavedModel's prediction with ``TFPredictor.predict_dataframe``
   (through Arrow) and writes ``--output`` as Parquet;
2. runs the same records through ``TFPredictor.predict()``, whose RDD of
   ndarrays feeds ordinary RDD transformations: the predicted class of each
   record (argmax) and the number of records per class.

    spark-submit --master spark://host:7077 examples/batch_inference.py \\
        --saved_model /models/classifier --input /data/scoring.parquet --output /data/scored.parquet

``--smoke`` writes a small Parquet input and a SavedModel to a temporary folder first.
"""

from __future__ import annotations

import os
import tempfile
from typing import Dict, Optional, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import sparktf  # noqa: F401 - before TensorFlow: keeps its start-up log lines out of the output

import keras
import numpy as np
from pyspark.sql import DataFrame, SparkSession

from example_support import example_parser, start_spark
from sparktf import TFDataset, TFPredictor

SMOKE_FEATURES = 8
SMOKE_CLASSES = 3


def write_smoke_inputs(spark: SparkSession, folder: str, num_records: int = 200) -> Dict[str, str]:
    """A Parquet file of random feature vectors and a small classifier's SavedModel under ``folder``."""
    rng = np.random.default_rng(0)
    features = rng.normal(size=(num_records, SMOKE_FEATURES)).astype(np.float32)
    rows = [(int(i), vector.tolist()) for i, vector in enumerate(features)]
    input_path = os.path.join(folder, "input.parquet")
    spark.createDataFrame(rows, "id long, features array<float>").repartition(2).write.parquet(input_path)
    model = keras.Sequential([keras.Input((SMOKE_FEATURES,), name="features"),
                              keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(SMOKE_CLASSES, activation="softmax")])
    saved_model = os.path.join(folder, "saved_model")
    model.export(saved_model, verbose=False)
    return {"input": input_path, "saved_model": saved_model, "output": os.path.join(folder, "scored.parquet")}


def score_parquet(predictor: TFPredictor, df: DataFrame, feature_col: str, output: str) -> DataFrame:
    """Append the prediction column to ``df`` and write the result as Parquet to ``output``."""
    scored = predictor.predict_dataframe(df, feature_col, output_col="prediction")
    scored.write.mode("overwrite").parquet(output)
    return scored


def class_counts(predictor: TFPredictor) -> Dict[int, int]:
    """Records per predicted class: ``predict()``'s RDD, then argmax and a count per class on Spark."""
    predictions = predictor.predict()
    per_class = predictions.map(lambda scores: (int(np.argmax(scores)), 1)).reduceByKey(lambda a, b: a + b)
    return dict(per_class.collect())


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, object]:
    """Score the Parquet input; returns the output path, rows written and records per class."""
    parser = example_parser(__doc__.splitlines()[0])
    parser.add_argument("--saved_model", help="SavedModel directory (tf.saved_model.save / model.export)")
    parser.add_argument("--input", help="Parquet input")
    parser.add_argument("--output", help="Parquet output: the input columns plus 'prediction'")
    parser.add_argument("--feature_col", default="features", help="array column fed to the model")
    parser.add_argument("--batch_per_thread", type=int, default=256, help="records per model call")
    args = parser.parse_args(argv)
    spark = start_spark(args, "sparktf-batch-inference")
    if args.smoke:
        vars(args).update(write_smoke_inputs(spark, tempfile.mkdtemp(prefix="sparktf-inference-")))
    elif not (args.saved_model and args.input and args.output):
        parser.error("give --saved_model, --input and --output (or --smoke)")

    df = spark.read.parquet(args.input)
    dataset = TFDataset.from_dataframe(df, args.feature_col, batch_per_thread=args.batch_per_thread)
    predictor = TFPredictor.from_saved_model(args.saved_model, dataset)
    score_parquet(predictor, df, args.feature_col, args.output)
    written = spark.read.parquet(args.output).count()
    print(f"wrote {written} scored rows to {args.output}")
    counts = class_counts(predictor)
    print("records per predicted class:", dict(sorted(counts.items())))
    return {"output": args.output, "rows": written, "class_counts": counts}


if __name__ == "__main__":
    main()
