"""The plain API needs torch only: it works where transformers cannot be imported."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
import sys
sys.modules["transformers"] = None  # import transformers now raises ImportError
import torch, ckptlib
engine = ckptlib.CheckpointEngine(output_dir=sys.argv[1], host_cache_size=0.01)
model = torch.nn.Linear(4, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
engine.save({"model": model, "optimizer": optimizer}, step=1)
engine.wait(persist=True)
assert torch.equal(engine.load().state["model"]["weight"], model.weight)
print("ok", engine.latest_step())
"""


@pytest.mark.slow  # a training process of its own
def test_the_plain_api_runs_without_transformers(tmp_path: Path) -> None:
    completed = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], check=False, capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "ok 1"
