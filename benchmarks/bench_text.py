"""Keras Hub text benchmark: fine-tuning a BERT classifier and batch generation with a GPT-2 causal LM.

Side by side in one run, on ``local[2]``:

* **Fine-tuning** a BERT-small-shaped ``BertTextClassifier`` (4 layers,
  hidden 256, 4 heads, sequence 128) with its preprocessor (WordPiece
  tokenizer, packing) on a text column: ``TFOptimizer`` on 2 workers (the
  preprocessor runs on the workers, per batch) against one process's
  ``Task.fit`` on both cores, whose ``tf.data`` pipeline runs the same
  preprocessor. Both are timed warm: sparktf's second ``optimize`` call (the
  launch included), ``fit``'s epochs after a first one. ``RESULT
  text_finetune_ratio`` is sparktf's records/s over ``fit``'s (goal >= 0.9).
* **Generation** with a GPT-2-shaped ``GPT2CausalLM`` (4 layers, hidden 256),
  32 new tokens per prompt, greedy: ``TFPredictor.from_keras(lm, ...,
  method="generate")`` on 2 partitions against one process's
  ``lm.generate`` over the same prompts in the same batches, on both cores.
  The completions must be equal. ``RESULT generate_ratio`` is prompts/s over
  prompts/s (goal >= 0.9).
* **LoRA**: the bytes a worker sends per step, full fine-tuning against
  ``backbone.enable_lora(4)`` (``RESULT lora_bytes_ratio``, full / LoRA).

The one-process sides run in a subprocess of their own (TensorFlow's default
threads: both cores). Nothing is downloaded: vocabularies and weights are
made here. ``--quick`` runs fewer batches.

Run ``flock /tmp/sparktf-bench.lock python benchmarks/bench_text.py [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any, Dict, List

WORDS = [f"w{i}" for i in range(2000)]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
LETTERS = "abcdefghijklmnopqrstuvwxyz"
SEQUENCE = 128
BATCH = 32
NEW_TOKENS = 32
PROMPT_WORDS = 16


def texts_and_labels(records: int, seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    texts, labels = [], []
    for _ in range(records):
        words = rng.choice(WORDS, SEQUENCE)
        texts.append(" ".join(words))
        labels.append(int("w7" in words[:20]))
    return texts, labels


def prompts(count: int, seed: int = 1) -> List[str]:
    import numpy as np

    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(list(LETTERS), PROMPT_WORDS)) for _ in range(count)]


def classifier(lora: int = 0) -> Any:
    import keras
    import keras_hub

    keras.utils.set_random_seed(0)
    tokenizer = keras_hub.models.BertTokenizer(vocabulary=SPECIALS + WORDS)
    preprocessor = keras_hub.models.BertTextClassifierPreprocessor(tokenizer, sequence_length=SEQUENCE)
    backbone = keras_hub.models.BertBackbone(vocabulary_size=len(SPECIALS) + len(WORDS), num_layers=4, num_heads=4,
                                             hidden_dim=256, intermediate_dim=1024, max_sequence_length=SEQUENCE)
    model = keras_hub.models.BertTextClassifier(backbone, num_classes=2, preprocessor=preprocessor)
    if lora:
        backbone.enable_lora(lora)
    model.compile(optimizer=keras.optimizers.SGD(0.01))
    return model


def causal_lm() -> Any:
    import keras
    import keras_hub

    keras.utils.set_random_seed(0)
    vocabulary = {"<|endoftext|>": 0, "\u0120": 1}
    for letter in LETTERS:
        vocabulary[letter] = len(vocabulary)
        vocabulary["\u0120" + letter] = len(vocabulary)
    merges = [f"\u0120 {letter}" for letter in LETTERS]
    tokenizer = keras_hub.models.GPT2Tokenizer(vocabulary=vocabulary, merges=merges)
    preprocessor = keras_hub.models.GPT2CausalLMPreprocessor(tokenizer, sequence_length=PROMPT_WORDS + NEW_TOKENS)
    backbone = keras_hub.models.GPT2Backbone(vocabulary_size=len(vocabulary), num_layers=4, num_heads=4,
                                             hidden_dim=256, intermediate_dim=1024,
                                             max_sequence_length=PROMPT_WORDS + NEW_TOKENS + 8)
    lm = keras_hub.models.GPT2CausalLM(backbone, preprocessor)
    lm.compile(sampler="greedy")
    return lm


def generate_options() -> Dict[str, Any]:
    return {"max_length": PROMPT_WORDS + NEW_TOKENS + 1, "stop_token_ids": None}


# ------------------------------------------------------------------ one process (a subprocess)


def single(kind: str, batches: int) -> Dict[str, Any]:
    import numpy as np

    if kind == "finetune":
        texts, labels = texts_and_labels(BATCH * batches)
        model = classifier()
        x, y = np.array(texts), np.array(labels)
        model.fit(x[:BATCH * 2], y[:BATCH * 2], batch_size=BATCH, epochs=1, verbose=0)  # trace, warm
        started = time.perf_counter()
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        return {"seconds": time.perf_counter() - started, "records": len(texts)}
    lm, items = causal_lm(), prompts(BATCH * batches)
    lm.generate(items[:BATCH], **generate_options())  # trace, warm
    started = time.perf_counter()
    outputs = [str(text) for start in range(0, len(items), BATCH)
               for text in lm.generate(items[start:start + BATCH], **generate_options())]
    return {"seconds": time.perf_counter() - started, "records": len(items), "outputs": outputs}


def one_process(kind: str, batches: int) -> Dict[str, Any]:
    output = subprocess.run([sys.executable, __file__, "--single", kind, str(batches)], check=True,
                            capture_output=True, text=True, timeout=3600).stdout
    return json.loads(output.strip().splitlines()[-1])


# ------------------------------------------------------------------ sparktf


def sparktf_finetune(spark: Any, batches: int, lora: int = 0) -> Dict[str, Any]:
    from sparktf import MaxIteration, TFDataset, TFOptimizer

    texts, labels = texts_and_labels(BATCH * batches)
    frame = spark.createDataFrame(list(zip(texts, labels)), "text string, label long").repartition(2).cache()
    frame.count()
    dataset = TFDataset.from_dataframe(frame, "text", "label", batch_size=BATCH, shuffle=False)
    optimizer = TFOptimizer.from_keras(classifier(lora), dataset, num_workers=2)
    optimizer.optimize(MaxIteration(2), verbose=0)  # cold: launch, model load, tracing
    started = time.perf_counter()
    optimizer.optimize(MaxIteration(2 + batches), verbose=0)
    seconds = time.perf_counter() - started
    traffic = optimizer.last_traffic
    frame.unpersist()
    return {"seconds": seconds, "records": BATCH * batches, "bytes_per_step": traffic.sent / max(traffic.steps, 1)}


def sparktf_generate(spark: Any, batches: int) -> Dict[str, Any]:
    from sparktf import TFDataset, TFPredictor

    items = prompts(BATCH * batches)
    frame = spark.createDataFrame([(p,) for p in items], "prompt string").coalesce(1).repartition(2)
    frame = frame.cache()
    ordered = [row["prompt"] for row in frame.collect()]
    dataset = TFDataset.from_dataframe(frame, "prompt", batch_per_thread=BATCH)
    predictor = TFPredictor.from_keras(causal_lm(), dataset, method="generate", **generate_options())
    predictor.predict().collect()  # warm: each worker loads the model and compiles its generate function
    started = time.perf_counter()
    outputs = predictor.predict().collect()
    seconds = time.perf_counter() - started
    frame.unpersist()
    return {"seconds": seconds, "records": len(items), "outputs": dict(zip(ordered, outputs))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few batches (a few minutes)")
    parser.add_argument("--single", nargs=2, metavar=("KIND", "BATCHES"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.single:
        print(json.dumps(single(args.single[0], int(args.single[1]))))
        return
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    import sparktf

    train_batches, generate_batches = (6, 6) if args.quick else (30, 24)
    spark = sparktf.init_spark(master="local[2]", app_name="bench_text")

    fit = one_process("finetune", train_batches)
    spark_fit = sparktf_finetune(spark, train_batches)
    lora = sparktf_finetune(spark, 2, lora=4)
    fit_rate, spark_rate = fit["records"] / fit["seconds"], spark_fit["records"] / spark_fit["seconds"]
    print(f"fine-tuning: fit {fit_rate:.1f} records/s, sparktf 2 workers {spark_rate:.1f} records/s")
    print(f"bytes per step: full {spark_fit['bytes_per_step'] / 1e6:.2f} MB, LoRA rank 4 "
          f"{lora['bytes_per_step'] / 1e6:.3f} MB")

    generated = one_process("generate", generate_batches)
    spark_generated = sparktf_generate(spark, generate_batches)
    expected = dict(zip(prompts(BATCH * generate_batches), generated["outputs"]))
    same = all(spark_generated["outputs"][p] == text for p, text in expected.items())
    one_rate = generated["records"] / generated["seconds"]
    spark_gen_rate = spark_generated["records"] / spark_generated["seconds"]
    print(f"generation ({NEW_TOKENS} new tokens): one process {one_rate:.1f} prompts/s, sparktf 2 workers "
          f"{spark_gen_rate:.1f} prompts/s; completions equal: {same}")
    print(f"RESULT lora_bytes_ratio={spark_fit['bytes_per_step'] / lora['bytes_per_step']:.1f}")
    print(f"RESULT text_finetune_ratio={spark_rate / fit_rate:.3f}")
    print(f"RESULT generate_ratio={spark_gen_rate / one_rate:.3f}")


if __name__ == "__main__":
    main()
