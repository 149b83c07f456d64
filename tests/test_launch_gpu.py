"""Spark GPU resources become the child's CUDA_VISIBLE_DEVICES (fake GPUs from a discovery script, on CPU).

``local[N]`` does not schedule task resources, so this runs a small
``local-cluster[1,2,1024]`` (one executor with two cores and two fake GPUs)
in its own driver process.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

DRIVER = '''
import os, sys
import sparktf

script = sys.argv[1]
conf = {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1", "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false", "spark.executor.memory": "512m"}
for scope, amount in (("worker", "2"), ("executor", "2"), ("driver", "2")):
    conf[f"spark.{scope}.resource.gpu.amount"] = amount
    conf[f"spark.{scope}.resource.gpu.discoveryScript"] = script
conf["spark.task.resource.gpu.amount"] = "1"
session = sparktf.init_spark("local-cluster[1,2,1024]", conf=conf)
session.sparkContext.setLogLevel("ERROR")


def report(args, ctx):
    print(f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')} ctx.gpus={','.join(ctx.gpus)}")
    return os.environ.get("CUDA_VISIBLE_DEVICES")


print("chief returned", sparktf.run(report, num_workers=2, timeout=120))
session.stop()
'''


def test_each_task_child_sees_its_own_spark_gpu(tmp_path):
    script = tmp_path / "gpus.sh"
    script.write_text('#!/bin/sh\necho \'{"name": "gpu", "addresses": ["0", "1"]}\'\n')
    script.chmod(0o755)
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    env.pop("CUDA_VISIBLE_DEVICES", None)
    completed = subprocess.run([sys.executable, str(driver), str(script)], env=env, cwd=tmp_path,
                               capture_output=True, text=True, timeout=240)
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output[-3000:]
    devices = re.findall(r"\[worker (\d)\] CUDA_VISIBLE_DEVICES=(\S+) ctx\.gpus=(\S+)", output)
    assert sorted(device for _, device, _ in devices) == ["0", "1"], output[-3000:]
    assert all(device == gpus for _, device, gpus in devices)
    chief_device = dict((rank, device) for rank, device, _ in devices)["0"]
    assert f"chief returned {chief_device}" in output
