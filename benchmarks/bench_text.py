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
* **Generation** with a GPT-2-shaped ``GPT2CausalLM`` (4 layers, hidden 256,
  320 positions), greedy, 32 new tokens per prompt, prompts of log-normal
  length (8-256 tokens), batches of 16:

  - ``RESULT decode_step_growth``: milliseconds per row and decode step
    at cache length 512 over 64 with a key and a value buffer per layer
    (the curve printed, in one process on one thread, batches of 16;
    ``decode_step_gain_512``: ``call_with_cache``'s step over it at 512);
  - ``RESULT generate_buffers_ratio``: new tokens/s of the engine against
    the same engine decoding with ``call_with_cache`` (before per-layer
    buffers), on the same 2 workers and prompts (goal >= 2);
  - ``RESULT generate_engine_ratio``: useful new tokens/s of
    ``TFPredictor.from_keras(lm, ..., method="generate", max_new_tokens=32)``
    (prompts grouped by length, chunked decoding) against today's path, a
    task calling ``lm.generate`` on each batch in input order with one
    ``max_length`` (the longest prompt plus 32), on the same 2 workers and
    prompts (goal >= 3). The completions must be equal (today's cut to 32
    new tokens), and each side's peak worker memory is printed;
  - ``RESULT generate_prefix_ratio``: the same path when every prompt starts
    with one 128-token template, given as ``prefix=`` against written into
    each prompt, the engine looking for no shared runs (goal >= 1.5);
    ``generate_found_prefix_ratio``: written into each prompt, the engine
    finding the shared run against not looking;
  - ``RESULT generate_found_templates_ratio``: prompts made of one of 4
    templates of 128 tokens and a tail of 8-128, the engine finding the
    runs they share against not looking (goal >= 1.5);
  - ``RESULT generate_ratio``: the new path on 2 partitions against one
    process's best, ``lm.generate`` on batches sorted by length with each
    batch's ``max_length``, on both cores (prompts/s over prompts/s, goal
    >= 0.9).
* **LoRA**: the bytes a worker sends per step, full fine-tuning against
  ``backbone.enable_lora(4)`` (``RESULT lora_bytes_ratio``, full / LoRA).

The one-process sides run in a subprocess of their own (TensorFlow's default
threads: both cores). Nothing is downloaded: vocabularies and weights are
made here. ``--quick`` runs fewer batches, ``--generation`` generation only.

Run ``flock /tmp/sparktf-bench.lock python benchmarks/bench_text.py [--quick]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from typing import Any, Dict, Iterator, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # worker_memory, beside this file

WORDS = [f"w{i}" for i in range(2000)]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
LETTERS = "abcdefghijklmnopqrstuvwxyz"
SEQUENCE = 128
BATCH = 32
NEW_TOKENS = 32
GENERATE_BATCH = 16
LM_POSITIONS = 320  # the longest prompt (256 tokens) and its new tokens fit
PREFIX_WORDS = 127  # with the start token: a 128-token template
CURVE_LENGTHS = (64, 128, 256, 512)  # cache lengths of the decode-step curve


def texts_and_labels(records: int, seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    texts, labels = [], []
    for _ in range(records):
        words = rng.choice(WORDS, SEQUENCE)
        texts.append(" ".join(words))
        labels.append(int("w7" in words[:20]))
    return texts, labels


def prompts(count: int, seed: int = 1, longest: int = 255) -> List[str]:
    """``count`` prompts of 7 to ``longest`` one-token words (log-normal, median 40): 8 to ``longest + 1`` tokens."""
    import numpy as np

    rng = np.random.default_rng(seed)
    lengths = np.clip(np.exp(rng.normal(np.log(40), 0.8, count)), 7, longest).astype(int)
    return [" ".join(rng.choice(list(LETTERS), length)) for length in lengths]


def template(seed: int = 7) -> str:
    """A 128-token instruction template (the start token and 127 words) every prompt of the prefix case shares."""
    import numpy as np

    return " ".join(np.random.default_rng(seed).choice(list(LETTERS), PREFIX_WORDS))


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


def causal_lm(positions: int = LM_POSITIONS) -> Any:
    import keras
    import keras_hub

    keras.utils.set_random_seed(0)
    vocabulary = {"<|endoftext|>": 0, "\u0120": 1}
    for letter in LETTERS:
        vocabulary[letter] = len(vocabulary)
        vocabulary["\u0120" + letter] = len(vocabulary)
    merges = [f"\u0120 {letter}" for letter in LETTERS]
    tokenizer = keras_hub.models.GPT2Tokenizer(vocabulary=vocabulary, merges=merges)
    preprocessor = keras_hub.models.GPT2CausalLMPreprocessor(tokenizer, sequence_length=64)
    backbone = keras_hub.models.GPT2Backbone(vocabulary_size=len(vocabulary), num_layers=4, num_heads=4,
                                             hidden_dim=256, intermediate_dim=1024, max_sequence_length=positions)
    lm = keras_hub.models.GPT2CausalLM(backbone, preprocessor)
    lm.compile(sampler="greedy")
    return lm


def token_count(lm: Any, text: str) -> int:
    """The tokens ``generate`` starts ``text`` with (the start token included)."""
    import numpy as np

    packed = lm.preprocessor.generate_preprocess([text], sequence_length=LM_POSITIONS)
    return int(np.asarray(packed["padding_mask"]).sum())


# ------------------------------------------------------------------ one process (a subprocess)


def single(kind: str, count: int) -> Dict[str, Any]:
    import numpy as np

    if kind == "finetune":
        batches = count
        texts, labels = texts_and_labels(BATCH * batches)
        model = classifier()
        x, y = np.array(texts), np.array(labels)
        model.fit(x[:BATCH * 2], y[:BATCH * 2], batch_size=BATCH, epochs=1, verbose=0)  # trace, warm
        started = time.perf_counter()
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        return {"seconds": time.perf_counter() - started, "records": len(texts)}
    lm, items = causal_lm(), prompts(count)
    lengths = [token_count(lm, item) for item in items]
    order = sorted(range(len(items)), key=lengths.__getitem__)

    def sorted_batches() -> List[str]:
        outputs = [""] * len(items)
        for start in range(0, len(items), GENERATE_BATCH):
            rows = order[start:start + GENERATE_BATCH]
            texts = lm.generate([items[i] for i in rows], stop_token_ids=None,
                                max_length=max(lengths[i] for i in rows) + NEW_TOKENS)
            for i, text in zip(rows, texts):
                outputs[i] = str(text)
        return outputs

    sorted_batches()  # trace, warm
    started = time.perf_counter()
    outputs = sorted_batches()
    return {"seconds": time.perf_counter() - started, "records": len(items), "outputs": outputs}


def one_process(kind: str, count: int) -> Dict[str, Any]:
    output = subprocess.run([sys.executable, __file__, "--single", kind, str(count)], check=True,
                            capture_output=True, text=True, timeout=3600).stdout
    return json.loads(output.strip().splitlines()[-1])


def decode_curve() -> Dict[int, Dict[str, float]]:
    """Milliseconds per row and decode step at cache lengths 64 to 512 (batches of ``GENERATE_BATCH``, 8 steps,
    best of 4, TensorFlow on 1 thread as in a task): ``call_with_cache``'s decoder (copying the cache) and the one
    with a buffer per layer."""
    import numpy as np
    import tensorflow as tf

    from sparktf.inference.decoding import Decoder, probe_decoding
    from sparktf.inference.kv_cache import LayerBufferDecoder, buffer_family

    tf.config.threading.set_intra_op_parallelism_threads(1)  # before TensorFlow's runtime starts: main calls it first
    tf.config.threading.set_inter_op_parallelism_threads(1)
    lm = causal_lm(positions=CURVE_LENGTHS[-1])
    layout, _ = probe_decoding(lm)
    family, _ = buffer_family(lm, layout)
    decoders = {"copying": Decoder(lm, layout), "buffers": LayerBufferDecoder(lm, layout, family)}
    rng, steps, curve = np.random.default_rng(3), 8, {}
    for length in CURVE_LENGTHS:
        token_ids = rng.integers(2, 50, (GENERATE_BATCH, length)).astype(np.int32)
        tokens, mask = tf.constant(token_ids), tf.constant(np.zeros(token_ids.shape, bool))
        curve[length] = {}
        for name, decoder in decoders.items():
            cache = decoder.prefill(token_ids, length - steps)
            best = float("inf")
            for _ in range(4):  # the first traces
                started = time.perf_counter()
                decoder.decode(tokens, cache, length - steps, mask, steps)[0].numpy()
                best = min(best, time.perf_counter() - started)
            curve[length][name] = best / steps / GENERATE_BATCH * 1e3
        print(f"decode step at cache length {length}: {curve[length]['copying']:.3f} ms per row copying, "
              f"{curve[length]['buffers']:.3f} with a buffer per layer", flush=True)
    return curve


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


def prompt_frame(spark: Any, items: List[str]) -> Any:
    frame = spark.createDataFrame(list(enumerate(items)), "id long, prompt string").coalesce(1).repartition(2)
    return frame.cache()


def sparktf_generate(frame: Any, **options: Any) -> Dict[str, Any]:
    """The new path over ``frame``'s prompts: ``{id: completion}``, seconds of the second run, peak worker memory."""
    from sparktf import TFDataset, TFPredictor
    from worker_memory import PeakSampler

    dataset = TFDataset.from_dataframe(frame, "prompt", batch_per_thread=GENERATE_BATCH)
    predictor = TFPredictor.from_keras(causal_lm(), dataset, method="generate", stop_token_ids=None,
                                       max_new_tokens=NEW_TOKENS, **options)
    predictor.predict_dataframe(frame, "prompt").collect()  # warm: each worker loads and traces
    with PeakSampler() as memory:
        started = time.perf_counter()
        rows = predictor.predict_dataframe(frame, "prompt").collect()
        seconds = time.perf_counter() - started
    return {"seconds": seconds, "outputs": {row["id"]: row["prediction"] for row in rows}, "peak": memory.peak}


def todays_generate(frame: Any, max_length: int) -> Dict[str, Any]:
    """Today's path: a task calling ``lm.generate`` on each batch of its partition, in input order, with one
    ``max_length``, the model shipped and cached per worker as sparktf does."""
    from sparktf.models.cache import cached
    from sparktf.models.payload import ModelPayload
    from worker_memory import PeakSampler

    payload = ModelPayload.from_model(causal_lm(), include_optimizer=False)
    shared = frame.sparkSession.sparkContext.broadcast(payload.to_bytes())
    key = payload.key

    def generate_partition(rows: Any) -> Any:
        lm = cached("bench-today:" + key, lambda: ModelPayload.from_bytes(shared.value).build())
        rows = list(rows)
        for start in range(0, len(rows), GENERATE_BATCH):
            batch = rows[start:start + GENERATE_BATCH]
            texts = lm.generate([row["prompt"] for row in batch], max_length=max_length, stop_token_ids=None)
            yield from ((row["id"], str(text)) for row, text in zip(batch, texts))

    frame.rdd.mapPartitions(generate_partition).collect()  # warm: each worker loads and traces every batch shape
    with PeakSampler() as memory:
        started = time.perf_counter()
        outputs = dict(frame.rdd.mapPartitions(generate_partition).collect())
        seconds = time.perf_counter() - started
    return {"seconds": seconds, "outputs": outputs, "peak": memory.peak}


@contextlib.contextmanager
def engine_without(feature: str) -> Iterator[None]:
    """Predictors made inside generate without one of the engine's features, as the driver sets them up:
    ``"buffers"`` decode with ``call_with_cache`` (the engine before per-layer buffers: the driver's check of the
    model's family answers no); ``"shared_runs"`` look for no leading runs the prompts share."""
    from sparktf.inference import generation

    name, value = {"buffers": ("buffer_family", lambda lm, layout: (None, "the benchmark's baseline")),
                   "shared_runs": ("MIN_SHARED_RUN", None)}[feature]
    kept = getattr(generation, name)
    setattr(generation, name, value)
    try:
        yield
    finally:
        setattr(generation, name, kept)


def generation(spark: Any, count: int) -> Dict[str, float]:
    """The generation ratios (see the module docstring)."""
    lm, items = causal_lm(), prompts(count)
    lengths = [token_count(lm, item) for item in items]
    frame = prompt_frame(spark, items)
    engine = sparktf_generate(frame)
    with engine_without("buffers"):
        copying = sparktf_generate(frame)
    same_engine = sum(copying["outputs"][i] == engine["outputs"][i] for i in range(len(items)))
    today = todays_generate(frame, max(lengths) + NEW_TOKENS)
    same = sum(today["outputs"][i].startswith(engine["outputs"][i]) for i in range(len(items)))
    tokens = NEW_TOKENS * len(items)
    print(f"generation, {len(items)} prompts of {min(lengths)}-{max(lengths)} tokens, {NEW_TOKENS} new each: "
          f"today's path {tokens / today['seconds']:.0f} new tokens/s, sparktf {tokens / engine['seconds']:.0f} "
          f"new tokens/s ({len(items) / engine['seconds']:.1f} prompts/s); completions the start of today's: "
          f"{same}/{len(items)}; "
          f"peak worker RssAnon: today's {today['peak'] / 2**20:.0f} MB, sparktf {engine['peak'] / 2**20:.0f} MB")
    print(f"the engine decoding with call_with_cache (copying the cache): {tokens / copying['seconds']:.0f} new "
          f"tokens/s ({len(items) / copying['seconds']:.1f} prompts/s); completions equal: {same_engine}/{len(items)}")

    prefix, short = template(), prompts(count, seed=2, longest=127)
    frame.unpersist()
    frame = prompt_frame(spark, [" " + item for item in short])
    shared = sparktf_generate(frame, prefix=prefix)
    frame.unpersist()
    frame = prompt_frame(spark, [prefix + " " + item for item in short])
    with engine_without("shared_runs"):
        written = sparktf_generate(frame)
    found = sparktf_generate(frame)
    frame.unpersist()
    same_prefix = sum(prefix + shared["outputs"][i] == written["outputs"][i] == found["outputs"][i]
                      for i in range(len(short)))
    print(f"a shared 128-token prefix: given as prefix= {len(short) / shared['seconds']:.1f} prompts/s, written into "
          f"each prompt {len(short) / written['seconds']:.1f} prompts/s without looking for shared runs, "
          f"{len(short) / found['seconds']:.1f} with them; completions equal: {same_prefix}/{len(short)}")
    templated = [template(7 + i % 4) + " " + item for i, item in enumerate(prompts(count, seed=3, longest=127))]
    frame = prompt_frame(spark, templated)
    with engine_without("shared_runs"):
        ungrouped = sparktf_generate(frame)
    grouped = sparktf_generate(frame)
    frame.unpersist()
    same_grouped = sum(ungrouped["outputs"][i] == grouped["outputs"][i] for i in range(len(templated)))
    print(f"4 templates of 128 tokens and a tail of 8-128: {len(templated) / grouped['seconds']:.1f} prompts/s with "
          f"shared runs found, {len(templated) / ungrouped['seconds']:.1f} without; completions equal: "
          f"{same_grouped}/{len(templated)}")

    best = one_process("generate", count)
    print(f"one process, sorted batches, generate on both cores: {best['records'] / best['seconds']:.1f} prompts/s")
    return {"generate_buffers_ratio": copying["seconds"] / engine["seconds"],
            "generate_engine_ratio": today["seconds"] / engine["seconds"],
            "generate_prefix_ratio": written["seconds"] / shared["seconds"],
            "generate_found_prefix_ratio": written["seconds"] / found["seconds"],
            "generate_found_templates_ratio": ungrouped["seconds"] / grouped["seconds"],
            "generate_ratio": best["seconds"] / engine["seconds"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few batches (a few minutes)")
    parser.add_argument("--generation", action="store_true", help="generation only (no fine-tuning, no LoRA)")
    parser.add_argument("--single", nargs=2, metavar=("KIND", "BATCHES"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.single:
        print(json.dumps(single(args.single[0], int(args.single[1]))))
        return
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    import sparktf

    train_batches, generate_prompts = (6, 64) if args.quick else (30, 192)
    curve = decode_curve()
    spark = sparktf.init_spark(master="local[2]", app_name="bench_text")
    ratios = generation(spark, generate_prompts)
    ratios["decode_step_growth"] = curve[CURVE_LENGTHS[-1]]["buffers"] / curve[CURVE_LENGTHS[0]]["buffers"]
    ratios["decode_step_gain_512"] = curve[CURVE_LENGTHS[-1]]["copying"] / curve[CURVE_LENGTHS[-1]]["buffers"]
    if args.generation:
        for name, value in ratios.items():
            print(f"RESULT {name}={value:.3f}")
        return

    fit = one_process("finetune", train_batches)
    spark_fit = sparktf_finetune(spark, train_batches)
    lora = sparktf_finetune(spark, 2, lora=4)
    fit_rate, spark_rate = fit["records"] / fit["seconds"], spark_fit["records"] / spark_fit["seconds"]
    print(f"fine-tuning: fit {fit_rate:.1f} records/s, sparktf 2 workers {spark_rate:.1f} records/s")
    print(f"bytes per step: full {spark_fit['bytes_per_step'] / 1e6:.2f} MB, LoRA rank 4 "
          f"{lora['bytes_per_step'] / 1e6:.3f} MB")

    print(f"RESULT lora_bytes_ratio={spark_fit['bytes_per_step'] / lora['bytes_per_step']:.1f}")
    print(f"RESULT text_finetune_ratio={spark_rate / fit_rate:.3f}")
    for name, value in ratios.items():
        print(f"RESULT {name}={value:.3f}")


if __name__ == "__main__":
    main()
