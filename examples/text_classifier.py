"""Text classification with Keras Hub: a BERT classifier fine-tuned on a DataFrame text column, evaluated and scored.

Nothing is downloaded:

1. generates movie reviews in a DataFrame: a few neutral words (``"the plot
   was long"``) and one sentiment keyword (``"great"``, ``"boring"``), with
   ``label`` 1 for a positive keyword and 0 for a negative one, and holds out
   a fifth of them (``randomSplit``);
2. builds a small ``keras_hub.models.BertTextClassifier`` from config: a
   ``BertTokenizer`` on a vocabulary made here (the special tokens and the
   generated words), its ``BertTextClassifierPreprocessor``, a ``BertBackbone``
   of 2 layers of hidden size 64 (1 layer of 32 in ``--smoke``) and the
   classification head, with dropout;
3. fine-tunes it with ``TFDataset.from_dataframe(df, "text", "label")`` and
   ``TFOptimizer.from_keras(classifier, dataset)``. The executors run the
   classifier's preprocessor (tokenizer, packer) on each batch of strings, as
   ``classifier.fit`` would: the tokenizer and its vocabulary travel with the
   model;
4. prints the held-out accuracy (``TFOptimizer.evaluate`` on a held-out
   ``TFDataset``);
5. scores the held-out DataFrame with ``TFPredictor.predict_dataframe``: its
   columns plus ``prediction`` (the two classes' logits), from which Spark
   computes the predicted label and the share that matches ``label``.

With network access, start from a pretrained preset instead of the model
built from config (``--preset bert_tiny_en_uncased``), as on one machine::

    classifier = keras_hub.models.BertTextClassifier.from_preset("bert_tiny_en_uncased", num_classes=2)

``--preset`` also takes a preset folder (``classifier.save_to_preset(folder)``),
local or on cluster storage (``hdfs://``, ``s3a://``, ...: copied to the
driver's local disk first, see ``docs/guides/pretrained-models.md``).

    spark-submit examples/text_classifier.py --rows 20000 --epochs 3
    spark-submit examples/text_classifier.py --preset bert_tiny_en_uncased --learning_rate 5e-5

Needs Keras Hub: ``pip install "sparktf[hub]"``.
"""

from __future__ import annotations

import os
from typing import Dict, List, Optional, Sequence, Tuple

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import sparktf  # noqa: F401 - before TensorFlow: keeps its start-up log lines out of the output

import keras
import numpy as np
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from example_support import example_parser, global_batch, start_spark
from sparktf import MaxEpoch, TFDataset, TFOptimizer, TFPredictor, storage

try:
    import keras_hub
except ImportError as exc:  # pragma: no cover - the hub extra is missing
    raise ImportError('examples/text_classifier.py needs Keras Hub: pip install "sparktf[hub]"') from exc

#: Sentiment keywords: a review has one of them, and its label says which list it came from.
POSITIVE = ["good", "great", "lovely", "superb", "brilliant", "moving", "clever", "fun"]
NEGATIVE = ["bad", "awful", "boring", "poor", "dull", "silly", "weak", "tedious"]
#: Words around the keyword, telling nothing about the label.
NEUTRAL = ["the", "movie", "was", "plot", "film", "story", "actors", "and", "a", "ending", "music", "long",
           "cast", "script", "scene", "director", "its", "with", "of", "camera", "hero", "dialogue", "set",
           "in", "this", "year", "second", "half", "felt", "quite"]
#: The tokens every BERT vocabulary starts with.
SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
#: Keywords and neutral words of each list used in ``--smoke``.
SMOKE_KEYWORDS, SMOKE_NEUTRAL = 4, 12


# --------------------------------------------------------------------------
# The data


def word_lists(smoke: bool) -> Tuple[List[str], List[str], List[str]]:
    """The positive, negative and neutral words of this run (fewer of each in ``--smoke``)."""
    if smoke:
        return POSITIVE[:SMOKE_KEYWORDS], NEGATIVE[:SMOKE_KEYWORDS], NEUTRAL[:SMOKE_NEUTRAL]
    return POSITIVE, NEGATIVE, NEUTRAL


def reviews(spark: SparkSession, rows: int, words: Tuple[List[str], List[str], List[str]], max_words: int,
            seed: int = 0) -> DataFrame:
    """``rows`` generated reviews: columns ``text`` (string) and ``label`` (1 positive, 0 negative).

    A review is 3 to ``max_words - 1`` different neutral words with one
    sentiment keyword at a random place; about half the reviews are positive.
    """
    positive, negative, neutral = words
    rng = np.random.default_rng(seed)
    records = []
    for _ in range(rows):
        label = int(rng.integers(0, 2))
        text = list(rng.choice(neutral, int(rng.integers(3, max_words)), replace=False))
        text.insert(int(rng.integers(0, len(text) + 1)), str(rng.choice(positive if label else negative)))
        records.append((" ".join(text), label))
    return spark.createDataFrame(records, "text string, label long")


def vocabulary(words: Tuple[List[str], List[str], List[str]]) -> List[str]:
    """The BERT vocabulary of this run: the special tokens, then every generated word (WordPiece needs no more)."""
    return SPECIAL_TOKENS + [word for group in words for word in group]


# --------------------------------------------------------------------------
# The model


def build_classifier(vocab: List[str], sequence_length: int, num_layers: int, hidden_dim: int, num_heads: int,
                     dropout: float) -> "keras_hub.models.BertTextClassifier":
    """A BERT classifier built from config: tokenizer on ``vocab``, preprocessor, backbone and a 2-class head."""
    tokenizer = keras_hub.models.BertTokenizer(vocabulary=vocab, lowercase=True)
    preprocessor = keras_hub.models.BertTextClassifierPreprocessor(tokenizer, sequence_length=sequence_length)
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=len(vocab), num_layers=num_layers, num_heads=num_heads, hidden_dim=hidden_dim,
        intermediate_dim=2 * hidden_dim, max_sequence_length=sequence_length, dropout=dropout)
    return keras_hub.models.BertTextClassifier(backbone, num_classes=2, preprocessor=preprocessor, dropout=dropout)


#: Storage schemes ``--preset`` copies from (Keras Hub opens ``kaggle://``, ``hf://`` and ``gs://`` itself).
CLUSTER_SCHEMES = frozenset({"hdfs", "viewfs", "s3", "s3a", "abfs", "abfss", "az"})


def preset_classifier(preset: str, sequence_length: int) -> "keras_hub.models.BertTextClassifier":
    """A BERT classifier from a Keras Hub preset: a name, or a preset folder, local or on cluster storage.

    ``from_preset`` runs on the driver and reads the preset once; the model
    then travels to the executors with its weights and vocabulary. A folder
    on HDFS, S3 or ABFS is copied to the driver's local disk first (Keras Hub
    reads ``gs://`` itself).
    """
    if storage.is_local(preset):  # a preset name, a folder or a file: URI
        preset = storage.local_path(preset)
    elif storage.scheme_of(preset) in CLUSTER_SCHEMES:
        preset = storage.kept_local_copy(preset, "--preset")
    classifier = keras_hub.models.BertTextClassifier.from_preset(preset, num_classes=2)
    classifier.preprocessor.sequence_length = sequence_length  # presets default to 512 tokens
    return classifier



def scored_accuracy(scored: DataFrame) -> float:
    """The share of rows whose predicted label (the larger logit of ``prediction``) equals ``label``."""
    predicted = (F.col("prediction")[1] > F.col("prediction")[0]).cast("long")
    return float(scored.select(F.avg((predicted == F.col("label")).cast("double"))).first()[0])


def with_positive_probability(scored: DataFrame) -> DataFrame:
    """``scored`` with ``positive``: the softmax probability of class 1, from the two logits."""
    return scored.withColumn("positive", 1 / (1 + F.exp(F.col("prediction")[0] - F.col("prediction")[1])))


# --------------------------------------------------------------------------
# The job


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, object]:
    """Generate, fine-tune, evaluate and score; returns the accuracies, the loss per epoch and a few scored rows."""
    parser = example_parser(__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000, help="generated reviews (training and held-out)")
    parser.add_argument("--held_out", type=float, default=0.2, help="share of the reviews held out")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch_size", type=int, default=64, help="global batch (all workers)")
    parser.add_argument("--learning_rate", type=float, default=3e-3,
                        help="Adam's learning rate (a pretrained --preset wants about 5e-5)")
    parser.add_argument("--sequence_length", type=int, default=24, help="tokens per review, [CLS] and [SEP] included")
    parser.add_argument("--hidden_dim", type=int, default=64, help="BERT's hidden size (built from config)")
    parser.add_argument("--num_layers", type=int, default=2, help="transformer layers (built from config)")
    parser.add_argument("--num_heads", type=int, default=4, help="attention heads (built from config)")
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--preset", default=None,
                        help="a Keras Hub preset name (downloads it, e.g. bert_tiny_en_uncased) or folder, local or "
                             "a URI; default: a model built from config on this run's vocabulary")
    parser.add_argument("--seed", type=int, default=0, help="seeds the data, the split and the initial weights")
    args = parser.parse_args(argv)
    max_words = 12
    if args.smoke:
        args.rows, args.epochs, args.batch_size, args.sequence_length = 640, 4, 32, 12
        args.hidden_dim, args.num_heads, args.num_layers = 32, 2, 1
        max_words = 7
    spark = start_spark(args, "sparktf-text-classifier")

    # 1. The reviews and the split.
    words = word_lists(args.smoke)
    table = reviews(spark, args.rows, words, max_words, args.seed).repartition(args.num_workers)
    train, held_out = table.randomSplit([1 - args.held_out, args.held_out], seed=args.seed)
    train, held_out = train.cache(), held_out.cache()
    print(f"{train.count()} training and {held_out.count()} held-out reviews, e.g.:")
    for row in train.take(3):
        print(f"  {row['label']}  {row['text']}")

    # 2. The classifier: built from config on this run's vocabulary, or from a preset.
    keras.utils.set_random_seed(args.seed)
    if args.preset:
        classifier = preset_classifier(args.preset, args.sequence_length)
    else:
        classifier = build_classifier(vocabulary(words), args.sequence_length, args.num_layers, args.hidden_dim,
                                      args.num_heads, args.dropout)
    classifier.compile(optimizer=keras.optimizers.Adam(args.learning_rate),
                       metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")])
    print(f"{type(classifier).__name__}: {classifier.count_params()} parameters, "
          f"{classifier.preprocessor.tokenizer.vocabulary_size()} tokens in the vocabulary")

    # 3. Fine-tune on the text column: the preprocessor runs on the executors, batch by batch.
    batch_size = global_batch(args.batch_size, args.num_workers)
    dataset = TFDataset.from_dataframe(train, "text", "label", batch_size=batch_size, seed=args.seed)
    optimizer = TFOptimizer.from_keras(classifier, dataset, num_workers=args.num_workers)
    optimizer.optimize(end_trigger=MaxEpoch(args.epochs), verbose=2)

    # 4. The held-out accuracy.
    held_out_data = TFDataset.from_dataframe(held_out, "text", "label", batch_per_thread=256)
    scores = optimizer.evaluate(held_out_data)
    print(f"held-out accuracy={scores['accuracy']:.4f} loss={scores['loss']:.4f}")

    # 5. Score the held-out DataFrame: its columns plus the two logits.
    to_score = TFDataset.from_dataframe(held_out, "text", batch_per_thread=256)
    scored = TFPredictor.from_keras(classifier, to_score).predict_dataframe(held_out, "text")
    scored = with_positive_probability(scored).cache()
    agreement = scored_accuracy(scored)
    print(f"predict_dataframe agrees with the labels on {agreement:.4f} of the held-out reviews, e.g.:")
    examples = [row.asDict() for row in scored.select("text", "label", "positive").limit(5).collect()]
    for row in examples:
        print(f"  P(positive)={row['positive']:.3f} label={row['label']}  {row['text']}")
    for frame in (train, held_out, scored):
        frame.unpersist()
    return {"accuracy": float(scores["accuracy"]), "scored_accuracy": agreement, "examples": examples,
            "loss_per_epoch": [float(loss) for loss in optimizer.history.history["loss"]]}


if __name__ == "__main__":
    main()
