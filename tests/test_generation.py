"""Batch generation at engine speed: prompts grouped by length, ``max_new_tokens``, finished rows dropped, a shared
prefix prefilled once, leading runs prompts share found and prefilled once, one bad row not failing the job. Every
completion is checked against ``lm.generate`` on its prompt alone, for a GPT-2 and a Llama 3 built tiny from config;
a Mistral, a Gemma and a Gemma 2 decode with a buffer per layer too."""

import dataclasses

import numpy as np
import pytest

from sparktf import TFDataset, TFPredictor
from sparktf.errors import ConfigurationError

keras_hub = pytest.importorskip("keras_hub")

from sparktf.inference.generation import GenerationEngine, generation_options, length_buckets  # noqa: E402
from sparktf.inference.decoding import Decoder  # noqa: E402
from sparktf.inference.kv_cache import LayerBufferDecoder  # noqa: E402
from sparktf.inference.shared_runs import SharedRuns  # noqa: E402
from tiny_lms import gemma_lm, gpt2_lm, llama3_lm, mistral_lm, qwen_lm  # noqa: E402

PROMPTS = ["a b", "ab c", "c a b", "b", "a a c b a", "c c b", "ab ab", "b c", "a", "c b a c a b c", "b b", "ab"]


def _alone(lm, prompt, new_tokens, stop_token_ids):
    """``lm.generate`` on ``prompt`` alone, with the ``max_length`` that gives it ``new_tokens`` new tokens."""
    tokens = int(np.asarray(lm.preprocessor.generate_preprocess([prompt], sequence_length=32)["padding_mask"]).sum())
    return str(lm.generate([prompt], max_length=tokens + new_tokens, stop_token_ids=stop_token_ids)[0])


@pytest.mark.parametrize("family", ["gpt2", "llama3"])
def test_each_completion_is_generate_on_its_prompt_alone_with_stop_tokens_a_prefix_and_few_compiles(family):
    lm = gpt2_lm() if family == "gpt2" else llama3_lm()
    stop = [lm.preprocessor.tokenizer.token_to_id("c")]  # a token the model makes, not its padding
    for stop_token_ids in (None, stop):
        engine = GenerationEngine(lm, generation_options(lm, {"max_new_tokens": 5, "stop_token_ids": stop_token_ids}))
        completions, window = engine.complete(PROMPTS, batch_size=3)
        assert completions == [_alone(lm, prompt, 5, stop_token_ids) for prompt in PROMPTS]
        if stop_token_ids is None:
            assert window.new_tokens == 5 * len(PROMPTS)
        else:
            assert window.new_tokens < 5 * len(PROMPTS)  # rows that stopped early left their batch
        assert engine.compiles == 2  # one prefill and one decode function, whatever the batch and length

    prefixed = GenerationEngine(lm, generation_options(lm, {"max_new_tokens": 4, "prefix": "a b c",
                                                            "stop_token_ids": None}))
    completions, _ = prefixed.complete([" " + prompt for prompt in PROMPTS], batch_size=4)
    assert ["a b c" + text for text in completions] == \
        [_alone(lm, "a b c " + prompt, 4, None) for prompt in PROMPTS]
    assert prefixed.compiles == 2  # the prefix's prefill is the same function

    stripped = GenerationEngine(lm, generation_options(lm, {"max_new_tokens": 3, "stop_token_ids": None,
                                                            "strip_prompt": True}))
    completions, _ = stripped.complete(PROMPTS[:4], batch_size=2)
    assert [prompt + text for prompt, text in zip(PROMPTS, completions)] == \
        [_alone(lm, prompt, 3, None) for prompt in PROMPTS[:4]]


def test_runs_prompts_share_are_found_prefilled_once_and_complete_as_without_them():
    runs = SharedRuns.find([np.array(tokens) for tokens in ([1, 2, 3, 4], [1, 2, 3, 5], [9, 9], [1, 2, 3, 4, 6])],
                           minimum=3)
    assert runs.groups.tolist() == [0, 0, -1, 0] and runs.runs.tolist() == [3] and runs.possible() == 6
    assert runs.batch_start([0, 0]) == 3 and runs.batch_start([0, -1]) == 0

    lm = gpt2_lm(max_sequence_length=64)
    templates = [" ".join(words.split() * 8) for words in ("a b c ab", "b a c c")]  # 33 and 41 tokens
    prompts = [templates[i % 2] + tail for i, tail in enumerate([" a", " b c", "", " c a b", " ab", " b", " c c"])]
    prompts += PROMPTS[:3]  # in no group
    for prefix in ("", "c c "):  # runs found after a given prefix too
        options = generation_options(lm, {"max_new_tokens": 4, "stop_token_ids": None, "prefix": prefix})
        completions, window = GenerationEngine(lm, options).complete(prompts, batch_size=3)
        without, plain = GenerationEngine(lm, dataclasses.replace(options, shared_run=None)).complete(prompts, 3)
        assert completions == without
        assert 0 < window.prefill_saved <= window.prefill_possible and plain.prefill_possible == 0
    assert "prefill of" in str(window) and "prefill of" not in str(plain)


@pytest.mark.parametrize("family", ["gpt2", "llama3"])
def test_every_keyword_of_generate_left_unset_or_set_means_what_it_means_to_generate(family):
    lm = gpt2_lm() if family == "gpt2" else llama3_lm()
    prompts = PROMPTS[:4] + ["c a b a b c a b c", "a a c b a c a b c a b"]  # longer than GPT-2's sequence length 8
    stop = [lm.preprocessor.tokenizer.token_to_id("c")]
    # GPT-2's end token here is its padding token (id 0): generate stops at once with the defaults
    for keywords in ({}, {"max_length": 6}, {"strip_prompt": True}, {"stop_token_ids": None},
                     {"stop_token_ids": stop, "max_length": 12}, {"stop_token_ids": None, "strip_prompt": True}):
        engine = GenerationEngine(lm, generation_options(lm, dict(keywords)))
        completions, _ = engine.complete(prompts, batch_size=2)
        assert completions == [str(lm.generate([prompt], **keywords)[0]) for prompt in prompts], keywords


def test_a_preset_round_trip_generates_as_generate_with_its_defaults(spark, tmp_path):
    lm = gpt2_lm()
    lm.save_to_preset(str(tmp_path / "preset"))
    loaded = keras_hub.models.CausalLM.from_preset(str(tmp_path / "preset"))
    frame = spark.createDataFrame([(prompt,) for prompt in PROMPTS[:6]], "prompt string").repartition(2).cache()
    prompts = [row["prompt"] for row in frame.collect()]
    dataset = TFDataset.from_dataframe(frame, "prompt", batch_per_thread=2)
    completions = TFPredictor.from_keras(loaded, dataset, method="generate", max_length=16).predict().collect()
    assert completions == [str(text) for text in loaded.generate(prompts, max_length=16)] == prompts
    frame.unpersist()


def test_gpt2_and_llama_decode_with_a_buffer_per_layer_and_another_family_copies_the_cache_saying_so_once(caplog):
    for lm in (gpt2_lm(), llama3_lm()):  # the completions: the test above; Mistral and Gemma: the test below
        assert isinstance(GenerationEngine(lm, generation_options(lm, {"max_new_tokens": 2})).decoder,
                          LayerBufferDecoder)
    lm = qwen_lm()
    with caplog.at_level("INFO", logger="sparktf"):
        engine = GenerationEngine(lm, generation_options(lm, {"max_new_tokens": 4, "stop_token_ids": None}))
        completions, _ = engine.complete(PROMPTS[:5], batch_size=2)
    assert type(engine.decoder) is Decoder
    said = [record.getMessage() for record in caplog.records if "call_with_cache" in record.getMessage()]
    assert said == ["decoding QwenCausalLM with call_with_cache, which copies the cache at each step: sparktf has no "
                    "decode step with a buffer per layer for QwenBackbone"]
    assert completions == [_alone(lm, prompt, 4, None) for prompt in PROMPTS[:5]]


@pytest.mark.parametrize("family", ["mistral", "gemma", "gemma2"])
def test_mistral_and_gemma_decode_with_a_buffer_per_layer_as_generate_does_past_their_sliding_windows(family):
    # Mistral's window (5 positions) and Gemma 2's (5, on every other layer) are shorter than the sequences; Gemma 2
    # adds norms after the attention and the feed-forward and soft caps on the attention scores and the logits
    lm = mistral_lm() if family == "mistral" else gemma_lm(gemma2=family == "gemma2")
    prompts = PROMPTS[:6] + ["c b a c a b c"]  # 2 to 8 tokens: 16 to 22 new ones, 2 or 3 chunks of 8 steps
    options = generation_options(lm, {"max_length": 24, "stop_token_ids": None})
    assert options.buffer_family == family.rstrip("2")  # the driver's check of one step's logits
    engine = GenerationEngine(lm, options)
    completions, _ = engine.complete(prompts, batch_size=3)
    assert isinstance(engine.decoder, LayerBufferDecoder)
    assert completions == [str(text) for text in lm.generate(prompts, max_length=24, stop_token_ids=None)]


def test_length_buckets_are_few_and_fixed_and_a_beam_sampler_keeps_generate():
    assert length_buckets(16) == [8, 16]
    assert length_buckets(1024) == [96, 128, 184, 256, 368, 512, 728, 1024]

    beam = gpt2_lm(sampler="beam")
    with pytest.raises(ConfigurationError, match=r"max_new_tokens and prefix need.*BeamSampler"):
        generation_options(beam, {"max_new_tokens": 4})
    engine = GenerationEngine(beam, generation_options(beam, {"max_length": 9, "stop_token_ids": None}))
    completions, _ = engine.complete(PROMPTS[:5], batch_size=1)  # a beam's rows are not independent of their batch
    assert engine.compiles == 0  # the model's own generate function on each sorted batch
    assert completions == [str(beam.generate([prompt], max_length=9, stop_token_ids=None)[0]) for prompt in PROMPTS[:5]]


def test_a_dataframe_of_prompts_keeps_its_order_and_one_bad_row_is_named_or_null(spark):
    lm = gpt2_lm()
    too_long = " ".join(["a"] * 14)  # 15 tokens with the start token: no room for 4 new ones in 16 positions
    rows = [(i, prompt) for i, prompt in enumerate(PROMPTS[:6] + [too_long] + PROMPTS[6:])]
    frame = spark.createDataFrame(rows, "id long, prompt string").repartition(2).cache()
    ordered = frame.collect()
    dataset = TFDataset.from_dataframe(frame, "prompt", batch_per_thread=2)

    with pytest.raises(ConfigurationError, match=r"takes no keyword\(s\) \['max_tokens'\].*max_new_tokens"):
        TFPredictor.from_keras(lm, dataset, method="generate", max_tokens=4)
    with pytest.raises(ConfigurationError, match="max_new_tokens must be a positive int"):
        TFPredictor.from_keras(lm, dataset, method="generate", max_new_tokens=0)

    nulls = TFPredictor.from_keras(lm, dataset, method="generate", max_new_tokens=4, stop_token_ids=None,
                                   on_error="null")
    completed = nulls.predict_dataframe(frame, "prompt", output_col="completion").collect()
    assert [row["id"] for row in completed] == [row["id"] for row in ordered]
    expected = [None if row["prompt"] == too_long else _alone(lm, row["prompt"], 4, None) for row in ordered]
    assert [row["completion"] for row in completed] == expected
    assert nulls.predict().collect() == expected

    raising = TFPredictor.from_keras(lm, dataset, method="generate", max_new_tokens=4, stop_token_ids=None)
    placed = frame.rdd.mapPartitionsWithIndex(lambda p, rows: [(p, i) for i, row in enumerate(rows) if row["id"] == 6])
    partition, record = placed.collect()[0]
    with pytest.raises(Exception, match=rf"DataError: partition {partition}, record {record}: the prompt has 15 "
                                        r"tokens .* 4 new tokens are wanted: longer than the model's sequence "
                                        r"length 16"):
        raising.predict_dataframe(frame, "prompt", output_col="completion").collect()
    frame.unpersist()


def test_a_null_rows_warning_gives_its_reason_without_telling_to_pass_what_was_passed(caplog):
    from sparktf.inference.generation import GenerationEngine, generation_options

    lm = gpt2_lm()
    too_long = " ".join(["a"] * 14)
    engine = GenerationEngine(lm, generation_options(lm, {"max_new_tokens": 4, "stop_token_ids": None,
                                                          "on_error": "null"}))
    with caplog.at_level("WARNING", logger="sparktf"):
        completions, _ = engine.complete([too_long, PROMPTS[0]], 2)
    assert completions[0] is None and completions[1] == _alone(lm, PROMPTS[0], 4, None)
    assert "longer than the model's sequence length 16. Shorten it or lower max_new_tokens" in caplog.text
    assert "pass on_error='null'" not in caplog.text


def test_the_cache_layout_is_probed_once_on_the_driver_and_travels_with_the_options(monkeypatch):
    import pickle

    from sparktf.inference import decoding

    lm = gpt2_lm()
    probes = []
    builder = decoding.cache_builder

    def counted_builder(model):
        build = builder(model)

        def counted(token_ids):
            probes.append(tuple(token_ids.shape))
            return build(token_ids)
        return counted

    monkeypatch.setattr(decoding, "cache_builder", counted_builder)
    options = generation_options(lm, {"max_new_tokens": 2, "stop_token_ids": None})
    assert probes == [(1, 2), (1, 3)]  # the driver's two tiny prefills
    shipped = pickle.loads(pickle.dumps(options))
    assert shipped.cache_layout == options.cache_layout is not None
    for _ in range(2):  # two workers
        completions, _ = GenerationEngine(lm, shipped).complete(PROMPTS[:2], batch_size=2)
        assert completions == [_alone(lm, prompt, 2, None) for prompt in PROMPTS[:2]]
    assert len(probes) == 2  # no worker probes again
