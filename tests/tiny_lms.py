"""Tiny Keras Hub causal LMs built from config (vocabularies made here, nothing downloaded): a GPT-2 and a Llama 3,
both with byte-level BPE tokenizers whose words are the letters a, b and c, a Qwen, and a Mistral and a Gemma
with SentencePiece tokenizers trained here."""

import keras
import keras_hub

SPACE = "\u0120"  # GPT-2's byte-level BPE writes a space before a word as this character
MERGES = ["a b", f"{SPACE} a", f"{SPACE} b", f"{SPACE} c"]
WORDS = ["a", "b", "c", SPACE, f"{SPACE}a", f"{SPACE}b", f"{SPACE}c", "ab"]


def gpt2_lm(seed=5, sequence_length=8, max_sequence_length=16, sampler="greedy"):
    """A one-layer GPT-2 (token 0 is its start, end and padding token; 16 positions)."""
    keras.utils.set_random_seed(seed)
    vocabulary = {"<|endoftext|>": 0, **{word: i + 1 for i, word in enumerate(WORDS)}}
    tokenizer = keras_hub.models.GPT2Tokenizer(vocabulary=vocabulary, merges=MERGES)
    preprocessor = keras_hub.models.GPT2CausalLMPreprocessor(tokenizer, sequence_length=sequence_length)
    backbone = keras_hub.models.GPT2Backbone(vocabulary_size=len(vocabulary), num_layers=1, num_heads=2, hidden_dim=16,
                                             intermediate_dim=32, max_sequence_length=max_sequence_length, dropout=0.0)
    lm = keras_hub.models.GPT2CausalLM(backbone, preprocessor)
    lm.compile(optimizer=keras.optimizers.SGD(0.5), sampler=sampler, jit_compile=False)
    return lm


def llama3_lm(seed=5, sequence_length=16):
    """A one-layer Llama 3 with grouped-query attention (2 query heads, 1 key/value head) and rotary positions."""
    keras.utils.set_random_seed(seed)
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"]
    vocabulary = {token: i for i, token in enumerate(specials + WORDS)}
    tokenizer = keras_hub.models.Llama3Tokenizer(vocabulary=vocabulary, merges=MERGES)
    preprocessor = keras_hub.models.Llama3CausalLMPreprocessor(tokenizer, sequence_length=sequence_length)
    backbone = keras_hub.models.Llama3Backbone(vocabulary_size=len(vocabulary), num_layers=1, num_query_heads=2,
                                               num_key_value_heads=1, hidden_dim=16, intermediate_dim=32)
    lm = keras_hub.models.Llama3CausalLM(backbone, preprocessor)
    lm.compile(sampler="greedy")
    return lm


def qwen_lm(seed=5):
    """A one-layer Qwen (2 query heads, 1 key/value head): a family decoded with ``call_with_cache``."""
    keras.utils.set_random_seed(seed)
    vocabulary = {"<|endoftext|>": 0, "<|im_end|>": 1, **{word: i + 2 for i, word in enumerate(WORDS)}}
    tokenizer = keras_hub.models.QwenTokenizer(vocabulary=vocabulary, merges=MERGES)
    preprocessor = keras_hub.models.QwenCausalLMPreprocessor(tokenizer, sequence_length=16)
    backbone = keras_hub.models.QwenBackbone(vocabulary_size=len(vocabulary), num_layers=1, num_query_heads=2,
                                             num_key_value_heads=1, hidden_dim=16, intermediate_dim=32)
    lm = keras_hub.models.QwenCausalLM(backbone, preprocessor)
    lm.compile(sampler="greedy")
    return lm


def _sharpened(lm, factor=4.0):
    """``lm`` compiled greedy, its kernels ``factor`` times their random values and its norms' scales random (not ones
    or zeros): sharper attention and logits, so that a tiny model's tokens depend on the positions it attends to."""
    for weight in lm.backbone.weights:
        if "kernel" in weight.path:
            weight.assign(weight * factor)
        elif weight.path.endswith("scale"):
            weight.assign(keras.random.normal(weight.shape, stddev=factor / 2))
    lm.compile(sampler="greedy")
    return lm


def _sentencepiece_proto(**special_ids):
    """A SentencePiece model (serialized) whose words are the letters a, b, c and "ab", trained here in memory."""
    import io

    import sentencepiece

    proto = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(["a b c ab", "ab c a b", "c a b c"] * 8), model_writer=proto, model_type="word",
        vocab_size=12, hard_vocab_limit=False, minloglevel=2, **special_ids)
    return proto.getvalue()


def mistral_lm(seed=5, sliding_window=5):
    """A two-layer Mistral (2 query heads, 1 key/value head) whose attention sees the last ``sliding_window``
    positions, with a SentencePiece tokenizer (<unk>, <s>, </s> and four words)."""
    keras.utils.set_random_seed(seed)
    tokenizer = keras_hub.models.MistralTokenizer(proto=_sentencepiece_proto(unk_id=0, bos_id=1, eos_id=2))
    preprocessor = keras_hub.models.MistralCausalLMPreprocessor(tokenizer, sequence_length=32)
    backbone = keras_hub.models.MistralBackbone(vocabulary_size=tokenizer.vocabulary_size(), num_layers=2,
                                                num_query_heads=2, num_key_value_heads=1, hidden_dim=16,
                                                intermediate_dim=32, sliding_window=sliding_window)
    return _sharpened(keras_hub.models.MistralCausalLM(backbone, preprocessor))


def gemma_lm(seed=5, gemma2=False):
    """A two-layer Gemma (2 query heads, 1 key/value head) with a SentencePiece tokenizer (<pad>, <eos>, <bos>,
    <unk> and four words); ``gemma2``: with Gemma 2's norms after the attention and the feed-forward, soft caps on
    the attention scores and the logits, and a sliding window of 5 positions on its first layer."""
    keras.utils.set_random_seed(seed)
    tokenizer = keras_hub.models.GemmaTokenizer(proto=_sentencepiece_proto(
        pad_id=0, eos_id=1, bos_id=2, unk_id=3, pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>"))
    preprocessor = keras_hub.models.GemmaCausalLMPreprocessor(tokenizer, sequence_length=32)
    gemma2_options = dict(query_head_dim_normalize=False, use_post_ffw_norm=True, use_post_attention_norm=True,
                          attention_logit_soft_cap=5.0, final_logit_soft_cap=3.0, use_sliding_window_attention=True,
                          sliding_window_size=5) if gemma2 else {}
    backbone = keras_hub.models.GemmaBackbone(vocabulary_size=tokenizer.vocabulary_size(), num_layers=2,
                                              num_query_heads=2, num_key_value_heads=1, hidden_dim=16,
                                              intermediate_dim=32, head_dim=4, **gemma2_options)
    return _sharpened(keras_hub.models.GemmaCausalLM(backbone, preprocessor))
