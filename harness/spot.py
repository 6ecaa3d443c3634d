"""The guide's Spot script as the resume tests submit it (in its container, offline, tiny)."""

from __future__ import annotations

SPOT = 'PYTHONPATH=$CHECKPOINT_VENDOR HF_DATASETS_OFFLINE="1" python /opt/examples/spot_train.py'
MAX_STEPS = 100_000  # the run is stopped once attempt 2 has committed: the fault always lands mid-run
ENV = {
    "SPOT_MAX_STEPS": str(MAX_STEPS),
    "SPOT_SAVE_STEPS": "20",
    "SPOT_MAX_LENGTH": "32",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "OMP_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
