"""sparktf in a Spark Connect client session: ``python connect_program.py``.

Prints one ``RESULT <case> <JSON object>`` line per case:
``session`` (init_spark through SPARK_REMOTE), ``run`` (sparktf.run's result
and its children's lines), ``run_failure``, ``slots`` (too many workers fails
at once), ``rdd_only`` and ``not_yet`` (the errors of what needs RDDs), and
``driver_host`` (an address this process cannot listen on).
"""

import contextlib
import io
import json
import os
import sys
import time

import numpy as np

import sparktf


def result(case, **values):
    print(f"RESULT {case} {json.dumps(values)}", flush=True)


def error_of(call):
    """(class name, first 300 characters, seconds) of what ``call`` raises; the class is None when nothing is."""
    started = time.monotonic()
    try:
        call()
    except Exception as error:  # the program reports every error, the test judges it
        return type(error).__name__, str(error)[:300], round(time.monotonic() - started, 1)
    return None, "", round(time.monotonic() - started, 1)


def ranks(args, ctx):
    print(f"rank {ctx.worker_num} of {ctx.num_workers} says {args}", flush=True)
    return {"rank": ctx.worker_num, "role": ctx.role, "tf_config_task": json.loads(os.environ["TF_CONFIG"])["task"]}


def failing(args, ctx):
    raise ValueError(f"planned failure in rank {ctx.worker_num}")


def doubling_net():
    import tensorflow as tf

    return sparktf.TFNet.from_function(tf.function(lambda x: 2.0 * x),
                                       [tf.TensorSpec([None, 2], tf.float32)])


def main():
    os.environ["SPARK_REMOTE"] = "local[2]"
    spark = sparktf.init_spark(conf={"spark.driver.host": "127.0.0.1", "spark.ui.enabled": "false"})
    result("session", module=type(spark).__module__, again=sparktf.init_spark() is spark)

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        value = sparktf.run(ranks, args="hi", num_workers=2)
    result("run", value=value, lines=sorted(line for line in printed.getvalue().splitlines() if "says" in line))

    name, message, _ = error_of(lambda: sparktf.run(failing, num_workers=2))
    result("run_failure", error=name, message=message.splitlines()[0] if message else "")

    name, message, seconds = error_of(lambda: sparktf.run(ranks, num_workers=3))
    result("slots", error=name, message=message, seconds=seconds)

    arrays = (np.zeros((4, 2), np.float32), np.zeros(4, np.float32))
    rdd_only = {
        "from_rdd": error_of(lambda: sparktf.TFDataset.from_rdd(None, ("float32", [2]))),
        "from_string_rdd": error_of(lambda: sparktf.TFDataset.from_string_rdd(None)),
        "TFNet_distributed": error_of(lambda: doubling_net().predict(np.ones((4, 2), np.float32), distributed=True)),
    }
    rdd_only["TFNet_local"] = (doubling_net().predict(np.ones((4, 2), np.float32)).tolist(), "")
    result("rdd_only", **{key: value[:2] for key, value in rdd_only.items()})
    not_yet = {
        "from_ndarrays": error_of(lambda: sparktf.TFDataset.from_ndarrays(arrays, batch_size=2)),
        "from_dataframe": error_of(lambda: sparktf.TFDataset.from_dataframe(spark.range(4), "id", batch_size=2)),
    }
    result("not_yet", **{key: value[:2] for key, value in not_yet.items()})

    spark.conf.set("spark.sparktf.driverHost", "192.0.2.1")  # TEST-NET-1: never an address of this machine
    name, message, seconds = error_of(lambda: sparktf.run(ranks, num_workers=1))
    result("driver_host", error=name, message=message, seconds=seconds)
    spark.stop()


if __name__ == "__main__":
    sys.exit(main())
