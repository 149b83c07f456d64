"""Batch generation in a session of its own, its logging left as a new user's is (nothing set up): prints the
completions as a JSON line ``COMPLETIONS [...]`` on stdout; the executors' log is this process's stderr."""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tiny_lms

import sparktf  # noqa: E402
from spark_conf import CONF  # noqa: E402
from sparktf import TFDataset, TFPredictor  # noqa: E402
from tiny_lms import gpt2_lm  # noqa: E402

PROMPTS = ["a b", "ab c", "c a b", "b", "a a c b a", " ".join(["a"] * 14)]  # the last: too long for 4 new tokens

spark = sparktf.init_spark("local[2]", app_name="generate-program", conf=CONF)
frame = spark.createDataFrame([(prompt,) for prompt in PROMPTS], "prompt string").repartition(2)
dataset = TFDataset.from_dataframe(frame, "prompt", batch_per_thread=2)
completions = TFPredictor.from_keras(gpt2_lm(), dataset, method="generate", max_new_tokens=4, stop_token_ids=None,
                                     on_error="null").predict().collect()
print("COMPLETIONS " + json.dumps(completions), flush=True)
spark.stop()
