"""Recommendation with NCF: clicks made in Spark, StringIndexer ids, class weights, AUC and each user's top 10.

Everything happens in Spark; nothing is downloaded:

1. generates an interaction table: user and item strings (``"user_123"``,
   ``"item_45"``) and a ``click`` label with a few percent positives. Items
   are drawn Zipf-like (a few are very popular), and whether a user clicks
   an item follows a hidden affinity (user and item biases plus a dot
   product of latent factors) that a model can learn;
2. turns the strings into ids with Spark ML's ``StringIndexer`` and splits
   the interactions into training and held-out ones (``randomSplit``);
3. trains an NCF model (Keras: GMF, the product of user and item
   embeddings, beside an MLP over their concatenation, and a sigmoid) with
   ``TFDataset.from_dataframe`` and ``TFOptimizer.optimize(class_weight=...)``
   to weigh up the rare clicks. The ``Embedding`` tables' gradients travel
   between the workers as the rows a batch looked up (see
   ``docs/guides/recommendation.md``);
4. reports the AUC on the held-out interactions (a compiled
   ``keras.metrics.AUC``, validated after every epoch);
5. scores each ranked user's candidate items (every item the user did not
   interact with in training) with ``TFPredictor.predict_dataframe`` and
   keeps the 10 best per user in Spark (a ``Window`` with ``row_number``).

    spark-submit examples/recommendation.py --users 5000 --items 2000 --interactions 1000000 --epochs 3
"""

from __future__ import annotations

import math
import os
from typing import Dict, List, Optional, Sequence, Tuple

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import sparktf  # noqa: F401 - before TensorFlow: keeps its start-up log lines out of the output

import keras
from pyspark.ml.feature import StringIndexer
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from example_support import example_parser, global_batch, start_spark
from sparktf import MaxEpoch, TFDataset, TFOptimizer, TFPredictor

#: Latent factors of the hidden affinity between users and items.
HIDDEN_FACTORS = 4
#: The affinity's constant term: it sets the share of clicks (a few percent).
CLICK_OFFSET = -4.5
#: Standard deviations of the hidden user and item biases (how much more some users click, some items get clicked).
USER_BIAS_SCALE, ITEM_BIAS_SCALE = 0.7, 1.0
#: Standard deviation of the factors' dot product: the share of the affinity that is personal taste.
TASTE_SCALE = 2.0
#: The columns the model reads, in the order of its inputs.
FEATURES = ["user_id", "item_id"]
TOP_K = 10


# --------------------------------------------------------------------------
# The data


def hidden_profiles(spark: SparkSession, count: int, seed: int, bias_scale: float) -> DataFrame:
    """``count`` rows ``number``, ``bias``, ``factors``: a hidden profile per user (or item), drawn in Spark.

    ``F.randn`` with a seed draws the same values for the same partitioning,
    so a seed gives the same profiles every run.
    """
    return spark.range(count, numPartitions=2).select(
        F.col("id").alias("number"),
        (F.randn(seed) * bias_scale).alias("bias"),
        F.array(*[F.randn(seed + 1 + k) for k in range(HIDDEN_FACTORS)]).alias("factors"),
    )


def dot(left: Column, right: Column) -> Column:
    """The dot product of two array columns of ``HIDDEN_FACTORS`` numbers."""
    return sum((left[k] * right[k] for k in range(1, HIDDEN_FACTORS)), left[0] * right[0])


def interactions(spark: SparkSession, num_users: int, num_items: int, num_interactions: int,
                 seed: int = 0) -> DataFrame:
    """The interaction table: ``user`` and ``item`` strings and ``click`` (1.0 or 0.0), one row per pair.

    Users are drawn uniformly and items Zipf-like: item ``k`` with a
    probability of about ``1 / (k + 1)``, from ``floor((num_items + 1) ** u) - 1``
    for a uniform ``u``. A pair is clicked with probability
    ``sigmoid(CLICK_OFFSET + user bias + item bias + user factors . item factors)``,
    a few percent overall. A pair drawn several times is kept once, clicked
    if any of its draws was (so no pair lands both in training and in the
    held-out data).

    Parameters
    ----------
    spark : SparkSession
    num_users, num_items : int
        How many users and items there are (a user or item never drawn has no row).
    num_interactions : int
        Pairs drawn, before duplicates are dropped.
    seed : int
        Seeds every random column: the same seed gives the same table.

    Returns
    -------
    pyspark.sql.DataFrame
        Columns ``user`` (string), ``item`` (string), ``click`` (double).
    """
    users = hidden_profiles(spark, num_users, seed + 100, USER_BIAS_SCALE)
    items = hidden_profiles(spark, num_items, seed + 200, ITEM_BIAS_SCALE)
    taste_scale = TASTE_SCALE / math.sqrt(HIDDEN_FACTORS)  # the dot product of unit normals has variance HIDDEN_FACTORS
    pairs = spark.range(num_interactions, numPartitions=4).select(
        F.floor(F.rand(seed) * num_users).alias("user_number"),
        (F.floor(F.pow(F.lit(num_items + 1.0), F.rand(seed + 1))) - 1).alias("item_number"),
    )
    affinity = (F.lit(CLICK_OFFSET) + F.col("u.bias") + F.col("i.bias")
                + taste_scale * dot(F.col("u.factors"), F.col("i.factors")))
    # Random columns are drawn before the shuffle (groupBy): a shuffle's output order varies from run to
    # run, and a rand() after it would draw other values each time the table is computed.
    draws = (pairs
             .join(F.broadcast(users.alias("u")), F.col("user_number") == F.col("u.number"))
             .join(F.broadcast(items.alias("i")), F.col("item_number") == F.col("i.number"))
             .select("user_number", "item_number",
                     (F.rand(seed + 2) < 1 / (1 + F.exp(-affinity))).cast("double").alias("click")))
    return (draws.groupBy("user_number", "item_number").agg(F.max("click").alias("click"))
            .select(F.concat(F.lit("user_"), F.col("user_number").cast("string")).alias("user"),
                    F.concat(F.lit("item_"), F.col("item_number").cast("string")).alias("item"),
                    "click"))


def index_strings(table: DataFrame) -> Tuple[DataFrame, List[str], List[str]]:
    """``table`` with ``user_id`` and ``item_id`` (ints from ``StringIndexer``), and the user and item strings.

    The indexer numbers the strings by descending frequency: ``user_id`` 0
    is the most active user, and ``users[user_id]`` is its string.
    """
    indexer = StringIndexer(inputCols=["user", "item"], outputCols=["user_index", "item_index"]).fit(table)
    users, items = indexer.labelsArray
    indexed = indexer.transform(table).select(
        "user", "item", "click",
        F.col("user_index").cast("int").alias("user_id"), F.col("item_index").cast("int").alias("item_id"))
    return indexed, list(users), list(items)


def balanced_class_weights(train: DataFrame) -> Dict[int, float]:
    """Class weights ``total / (2 * count)`` per click class (scikit-learn's "balanced"): each class weighs half."""
    counts = {int(row["click"]): row["count"] for row in train.groupBy("click").count().collect()}
    total = sum(counts.values())
    return {label: total / (2.0 * count) for label, count in sorted(counts.items())}


# --------------------------------------------------------------------------
# The model


def build_ncf(num_users: int, num_items: int, gmf_dim: int, mlp_dim: int, hidden: Sequence[int],
              learning_rate: float) -> keras.Model:
    """Neural collaborative filtering (He et al., 2017): GMF and an MLP side by side, a sigmoid on top.

    Each side has its own ``Embedding`` tables for users and items. GMF
    multiplies the user and item vectors element by element; the MLP runs
    over the two vectors concatenated. The model takes ``user_id`` and
    ``item_id`` (one int per record) and gives the click probability,
    compiled with binary cross-entropy and an ``AUC`` metric.

    Adam updates every row of a table at every step (its moments move even
    where the gradient is zero); with tables of millions of rows, prefer
    ``keras.optimizers.Adagrad``, which updates only the rows a batch looked
    up (see ``docs/guides/recommendation.md``).
    """
    user = keras.Input((), dtype="int32", name="user_id")
    item = keras.Input((), dtype="int32", name="item_id")
    gmf_user = keras.layers.Embedding(num_users, gmf_dim, name="gmf_user")(user)
    gmf_item = keras.layers.Embedding(num_items, gmf_dim, name="gmf_item")(item)
    gmf = keras.layers.Multiply(name="gmf")([gmf_user, gmf_item])
    mlp_user = keras.layers.Embedding(num_users, mlp_dim, name="mlp_user")(user)
    mlp_item = keras.layers.Embedding(num_items, mlp_dim, name="mlp_item")(item)
    mlp = keras.layers.Concatenate(name="mlp_input")([mlp_user, mlp_item])
    for width in hidden:
        mlp = keras.layers.Dense(width, activation="relu")(mlp)
    both = keras.layers.Concatenate(name="gmf_and_mlp")([gmf, mlp])
    click = keras.layers.Dense(1, activation="sigmoid", name="click")(both)
    model = keras.Model([user, item], click, name="ncf")
    model.compile(keras.optimizers.Adam(learning_rate), "binary_crossentropy", metrics=[keras.metrics.AUC(name="auc")])
    return model


# --------------------------------------------------------------------------
# Ranking


def candidates(indexed: DataFrame, train: DataFrame, num_ranked_users: int) -> DataFrame:
    """Every (user, item) pair of the first ``num_ranked_users`` users (the most active), less their training pairs.

    Columns ``user``, ``user_id``, ``item``, ``item_id``.
    """
    users = indexed.select("user", "user_id").where(F.col("user_id") < num_ranked_users).distinct()
    items = indexed.select("item", "item_id").distinct()
    seen = train.select("user_id", "item_id")
    return users.crossJoin(items).join(seen, ["user_id", "item_id"], "left_anti")


def top_items(scored: DataFrame, k: int = TOP_K) -> DataFrame:
    """The ``k`` best-scored rows of each user (fewer where it has fewer), with their ``rank`` (1 = best).

    A ``Window`` per user ordered by descending score (ties broken by
    ``item_id``) numbers the rows; the ones numbered up to ``k`` stay.
    """
    best_first = Window.partitionBy("user_id").orderBy(F.desc("score"), F.asc("item_id"))
    return (scored.withColumn("rank", F.row_number().over(best_first))
            .where(F.col("rank") <= k))


def show_lists(best: DataFrame, num_users: int) -> None:
    """Print the top items of the first ``num_users`` users as strings, best first."""
    lists = (best.groupBy("user", "user_id")
             .agg(F.sort_array(F.collect_list(F.struct("rank", "item"))).alias("top"))
             .orderBy("user_id").limit(num_users))
    for row in lists.collect():
        print(f"  {row['user']}: {', '.join(entry['item'] for entry in row['top'])}")


# --------------------------------------------------------------------------
# The job


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, object]:
    """Generate, index, train, evaluate and rank; returns the AUCs, the id tables and the top items."""
    parser = example_parser(__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=5_000, help="users in the generated table")
    parser.add_argument("--items", type=int, default=2_000, help="items in the generated table")
    parser.add_argument("--interactions", type=int, default=1_000_000, help="(user, item) pairs drawn")
    parser.add_argument("--held_out", type=float, default=0.2, help="share of interactions held out for the AUC")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch_size", type=int, default=2048, help="global batch (all workers)")
    parser.add_argument("--learning_rate", type=float, default=0.001, help="Adam's learning rate")
    parser.add_argument("--gmf_dim", type=int, default=8, help="width of the GMF embeddings")
    parser.add_argument("--mlp_dim", type=int, default=16, help="width of the MLP embeddings")
    parser.add_argument("--ranked_users", type=int, default=100,
                        help="users whose top 10 are computed (the most active ones)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the data, the split and the initial weights")
    args = parser.parse_args(argv)
    if args.smoke:
        args.users, args.items, args.interactions, args.epochs = 200, 100, 20_000, 2
        args.batch_size, args.learning_rate, args.gmf_dim, args.mlp_dim = 128, 0.01, 8, 8
        args.ranked_users = min(args.ranked_users, 20)
    spark = start_spark(args, "sparktf-recommendation")

    # 1-2. The interactions, ids and the split.
    table = interactions(spark, args.users, args.items, args.interactions, args.seed)
    indexed, user_strings, item_strings = index_strings(table)
    train, held_out = indexed.randomSplit([1 - args.held_out, args.held_out], seed=args.seed)
    train, held_out = train.cache(), held_out.cache()
    class_weight = balanced_class_weights(train)
    print(f"{len(user_strings)} users, {len(item_strings)} items; {train.count()} training and "
          f"{held_out.count()} held-out interactions; class weights {class_weight}")

    # 3-4. Train with class weights; the held-out AUC after every epoch.
    batch_size = global_batch(args.batch_size, args.num_workers)
    dataset = TFDataset.from_dataframe(train, FEATURES, "click", batch_size=batch_size,
                                       validation_df=held_out, seed=args.seed)
    keras.utils.set_random_seed(args.seed)
    model = build_ncf(len(user_strings), len(item_strings), args.gmf_dim, args.mlp_dim, (32, 16), args.learning_rate)
    optimizer = TFOptimizer.from_keras(model, dataset, num_workers=args.num_workers)
    history = optimizer.optimize(end_trigger=MaxEpoch(args.epochs), class_weight=class_weight, verbose=2)
    held_out_auc = [float(auc) for auc in history["val_auc"]]
    print("held-out AUC after each epoch:", [round(auc, 4) for auc in held_out_auc])

    # 5. Score the candidates and keep each user's top 10.
    pairs = candidates(indexed, train, args.ranked_users).cache()
    to_score = TFDataset.from_dataframe(pairs, FEATURES, batch_per_thread=1024)
    scored = TFPredictor.from_keras(model, to_score).predict_dataframe(pairs, FEATURES, output_col="prediction")
    scored = scored.withColumn("score", F.col("prediction")[0]).drop("prediction")
    best = top_items(scored).cache()
    recommendations = [row.asDict() for row in best.orderBy("user_id", "rank").collect()]
    print(f"top {TOP_K} of {len(set(row['user'] for row in recommendations))} users, e.g.:")
    show_lists(best, 3)
    candidate_counts = {row["user"]: row["count"] for row in pairs.groupBy("user").count().collect()}
    for frame in (train, held_out, pairs, best):
        frame.unpersist()
    return {"auc": held_out_auc[-1], "auc_per_epoch": held_out_auc, "users": user_strings, "items": item_strings,
            "class_weight": class_weight, "recommendations": recommendations, "candidate_counts": candidate_counts}


if __name__ == "__main__":
    main()
