"""Batch generation with a Keras Hub causal LM: prompts in a DataFrame, completions out as a string column.

Nothing is downloaded:

1. builds a tiny ``keras_hub.models.GPT2CausalLM`` from config: a
   ``GPT2Tokenizer`` whose vocabulary and merges are made here (letters, and
   letters after a space), its ``GPT2CausalLMPreprocessor``, a one-layer
   ``GPT2Backbone``, and the greedy sampler;
2. fine-tunes it on a text column of "alphabet runs" (``"c d e f g"``,
   wrapping from the last letter to ``a``) with
   ``TFDataset.from_dataframe(df, "text", batch_size=...)`` and
   ``TFOptimizer.from_keras(lm, dataset)``: the dataset has no labels, the
   preprocessor makes them (the next tokens) and the sample weights (the
   padding mask) on the executors, as ``lm.fit`` does;
3. completes a DataFrame of prompts (``"m n"``) with
   ``TFPredictor.from_keras(lm, dataset, method="generate", max_new_tokens=...)``
   and ``predict_dataframe(df, "prompt", output_col="completion")``: each
   executor groups its prompts by length, decodes each batch until its rows
   have their ``max_new_tokens`` (dropping finished rows between chunks of
   steps), and the completions come back as a string column, in the prompts'
   order. ``stop_token_ids=None`` goes to ``generate``'s meaning: no row stops
   early;
4. prints the completions and the share that continue the alphabet correctly.

With network access, a pretrained model is one line on the driver, and the rest
is the same (see ``docs/guides/pretrained-models.md``)::

    lm = keras_hub.models.GPT2CausalLM.from_preset("gpt2_base_en")

    spark-submit examples/batch_generate.py --letters 26 --sequences 4096 --epochs 3 --prompts 200

Needs Keras Hub: ``pip install "sparktf[hub]"``.
"""

from __future__ import annotations

import os
import string
from typing import Dict, List, Optional, Sequence, Tuple

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import sparktf  # noqa: F401 - before TensorFlow: keeps its start-up log lines out of the output

import keras
import numpy as np
from pyspark.sql import DataFrame, SparkSession

from example_support import example_parser, global_batch, start_spark
from sparktf import MaxEpoch, TFDataset, TFOptimizer, TFPredictor

try:
    import keras_hub
except ImportError as exc:  # pragma: no cover - the hub extra is missing
    raise ImportError('examples/batch_generate.py needs Keras Hub: pip install "sparktf[hub]"') from exc

#: GPT-2's byte-level BPE writes a space before a word as this character.
SPACE = "\u0120"
#: GPT-2's start, end and padding token.
END_OF_TEXT = "<|endoftext|>"


# --------------------------------------------------------------------------
# The tokenizer and the model


def letter_tokenizer(letters: str) -> "keras_hub.models.GPT2Tokenizer":
    """A GPT-2 tokenizer whose words are single letters: ``"a"``, and ``"Ġa"`` for ``" a"``.

    The vocabulary has the end-of-text token, each letter, the space and each
    letter after a space; the merges join the space to the letter after it.
    """
    vocabulary = {END_OF_TEXT: 0}
    for token in list(letters) + [SPACE] + [SPACE + letter for letter in letters]:
        vocabulary[token] = len(vocabulary)
    merges = [f"{SPACE} {letter}" for letter in letters]
    return keras_hub.models.GPT2Tokenizer(vocabulary=vocabulary, merges=merges)


def build_lm(letters: str, sequence_length: int, max_length: int, hidden_dim: int,
             learning_rate: float) -> "keras_hub.models.GPT2CausalLM":
    """A one-layer GPT-2 causal LM built from config, compiled with Adam and the greedy sampler.

    ``sequence_length`` is the preprocessor's for training; the backbone has
    room for ``max_length`` positions too (a prompt and its new tokens, which
    may be longer than the training texts).
    """
    preprocessor = keras_hub.models.GPT2CausalLMPreprocessor(letter_tokenizer(letters),
                                                             sequence_length=sequence_length)
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=preprocessor.tokenizer.vocabulary_size(), num_layers=1, num_heads=2, hidden_dim=hidden_dim,
        intermediate_dim=2 * hidden_dim, max_sequence_length=max(sequence_length, max_length), dropout=0.0)
    lm = keras_hub.models.GPT2CausalLM(backbone, preprocessor)
    lm.compile(optimizer=keras.optimizers.Adam(learning_rate), sampler="greedy")
    return lm


# --------------------------------------------------------------------------
# The data


def alphabet_run(letters: str, start: int, length: int) -> str:
    """``length`` letters from ``letters[start]`` on, wrapping to the first letter, separated by spaces."""
    return " ".join(letters[(start + offset) % len(letters)] for offset in range(length))


def training_texts(spark: SparkSession, letters: str, count: int, max_letters: int, seed: int) -> DataFrame:
    """``count`` alphabet runs of 6 to ``max_letters`` letters from random starts: a ``text`` column."""
    rng = np.random.default_rng(seed)
    rows = [(alphabet_run(letters, int(rng.integers(0, len(letters))), int(rng.integers(6, max_letters + 1))),)
            for _ in range(count)]
    return spark.createDataFrame(rows, "text string")


def prompts(spark: SparkSession, letters: str, count: int, seed: int) -> DataFrame:
    """``count`` prompts of 1 to 3 letters of a run: columns ``id`` and ``prompt``."""
    rng = np.random.default_rng(seed + 1)
    rows = [(index, alphabet_run(letters, int(rng.integers(0, len(letters))), int(rng.integers(1, 4))))
            for index in range(count)]
    return spark.createDataFrame(rows, "id long, prompt string")


def continues_the_run(letters: str, prompt: str, completion: str) -> bool:
    """Whether ``completion`` starts with ``prompt`` and goes on letter after letter through ``letters``."""
    words = completion.split()
    if not completion.startswith(prompt) or len(words) <= len(prompt.split()):
        return False
    return all(len(word) == 1 and word in letters for word in words) and all(
        letters.index(after) == (letters.index(before) + 1) % len(letters) for before, after in zip(words, words[1:]))


# --------------------------------------------------------------------------
# The job


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, object]:
    """Build, fine-tune and generate; returns the completions (in the prompts' order) and the share correct."""
    parser = example_parser(__doc__.splitlines()[0])
    parser.add_argument("--letters", type=int, default=26, help="the alphabet's first letters the runs go through")
    parser.add_argument("--sequences", type=int, default=4096, help="training texts (alphabet runs)")
    parser.add_argument("--max_letters", type=int, default=14, help="letters of the longest training run")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch_size", type=int, default=64, help="global batch (all workers)")
    parser.add_argument("--learning_rate", type=float, default=1e-2, help="Adam's learning rate")
    parser.add_argument("--hidden_dim", type=int, default=64, help="GPT-2's hidden size")
    parser.add_argument("--prompts", type=int, default=200, help="prompts to complete")
    parser.add_argument("--max_new_tokens", type=int, default=9, help="new tokens of each completion")
    parser.add_argument("--batch_per_thread", type=int, default=32, help="prompts per generate call")
    parser.add_argument("--seed", type=int, default=0, help="seeds the data and the initial weights")
    args = parser.parse_args(argv)
    if args.smoke:
        args.letters, args.sequences, args.epochs, args.batch_size = 8, 256, 3, 32
        args.hidden_dim, args.prompts, args.max_new_tokens = 32, 12, 6
    if not 2 <= args.letters <= 26:
        parser.error("--letters must be between 2 and 26")
    if args.max_letters < 6:
        parser.error("--max_letters must be at least 6 (the shortest training run)")
    letters = string.ascii_lowercase[:args.letters]
    spark = start_spark(args, "sparktf-batch-generate")

    # 1. The model, built from config.
    keras.utils.set_random_seed(args.seed)
    sequence_length = args.max_letters + 2  # a token per letter ("Ġc" is one), the start and end tokens
    positions = 4 + args.max_new_tokens  # the start token, a prompt of up to 3 letters, the new tokens
    lm = build_lm(letters, sequence_length, positions, args.hidden_dim, args.learning_rate)
    print(f"{type(lm).__name__}: {lm.count_params()} parameters, "
          f"{lm.preprocessor.tokenizer.vocabulary_size()} tokens in the vocabulary")

    # 2. Fine-tune on a text column: no labels, the preprocessor makes them on the executors.
    texts = training_texts(spark, letters, args.sequences, args.max_letters, args.seed).cache()
    print(f"{texts.count()} training texts, e.g. {texts.first()['text']!r}")
    dataset = TFDataset.from_dataframe(texts, "text", batch_size=global_batch(args.batch_size, args.num_workers),
                                       seed=args.seed)
    optimizer = TFOptimizer.from_keras(lm, dataset, num_workers=args.num_workers)
    optimizer.optimize(end_trigger=MaxEpoch(args.epochs), verbose=2)

    # 3. Complete the prompts on the executors: grouped by length, max_new_tokens each, a string column back.
    table = prompts(spark, letters, args.prompts, args.seed).cache()
    to_complete = TFDataset.from_dataframe(table, "prompt", batch_per_thread=args.batch_per_thread)
    generator = TFPredictor.from_keras(lm, to_complete, method="generate", max_new_tokens=args.max_new_tokens,
                                       stop_token_ids=None)
    completed = generator.predict_dataframe(table, "prompt", output_col="completion")
    rows: List[Tuple[int, str, str]] = [(row["id"], row["prompt"], row["completion"]) for row in completed.collect()]

    # 4. Show them.
    correct = sum(continues_the_run(letters, prompt, completion) for _, prompt, completion in rows)
    print(f"{len(rows)} completions, {correct} continue the alphabet, e.g.:")
    for _, prompt, completion in rows[:8]:
        print(f"  {prompt!r:10} -> {completion!r}")
    texts.unpersist()
    table.unpersist()
    return {"loss_per_epoch": [float(loss) for loss in optimizer.history.history["loss"]], "completions": rows,
            "correct_share": correct / len(rows) if rows else 0.0}


if __name__ == "__main__":
    main()
