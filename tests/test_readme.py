"""The README's Python snippets run as written (quick start and batch inference)."""

import os
import re

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def test_readme_snippets_train_evaluate_and_predict(spark, capsys):
    with open(README) as handle:
        blocks = re.findall(r"```python\n(.*?)```", handle.read(), flags=re.S)
    assert len(blocks) == 2
    namespace = {"__name__": "__main__"}
    for block in blocks:
        exec(compile(block, README, "exec"), namespace)
    history = namespace["history"]
    assert history["epochs"] == 3 and history["iterations"] == 3 * 64
    assert history["loss"][-1] < history["loss"][0]
    assert namespace["predictions"].count() == 4096
    scored = namespace["scored"]
    assert scored.columns == ["features", "label", "prediction"]
    row = scored.first()
    assert len(row["prediction"]) == 2 and abs(sum(row["prediction"]) - 1.0) < 1e-4
    assert "prediction" in capsys.readouterr().out
