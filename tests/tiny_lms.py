"""Tiny Keras Hub causal LMs built from config (vocabularies made here, nothing downloaded): a GPT-2 and a Llama 3,
both with byte-level BPE tokenizers whose words are the letters a, b and c, and a Qwen."""

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
