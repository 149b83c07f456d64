"""examples/tf_distribute_program.py --smoke runs end to end in its own Spark (local[2]) and saves the model."""

import os
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "tf_distribute_program.py"


def test_example_program_smoke(tmp_path):
    env = dict(os.environ, MASTER="local[2]", SPARK_LOCAL_IP="127.0.0.1", TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=os.pathsep.join([str(EXAMPLE.parent.parent), os.environ.get("PYTHONPATH", "")]))
    completed = subprocess.run(
        [sys.executable, str(EXAMPLE), "--smoke", "--model_dir", str(tmp_path / "model")],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240,
    )
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output[-3000:]
    assert "[chief 0] epoch 2/2 loss" in output and "[worker 0] epoch 2/2 loss" in output
    assert f'"model_path": "{tmp_path / "model" / "model.keras"}"' in output
    assert (tmp_path / "model" / "model.keras").stat().st_size > 0
