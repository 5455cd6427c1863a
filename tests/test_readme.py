"""The README's quickstart runs as written (with fewer steps)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_quickstart_runs():
    text = README.read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    assert "num_steps=5000" in code
    code = code.replace("num_steps=5000", "num_steps=200, progress_bar=False").replace("print(", "result_metrics = (")
    namespace: dict = {}
    exec(compile(code, str(README), "exec"), namespace)
    metrics = namespace["result_metrics"]
    assert set(metrics) == {"log_likelihood", "rmse", "crps"}
    assert metrics["rmse"] < 0.5  # 200 steps already fit the step function better than its spread (~1)
