"""A 200-step Trainer run (the guide's Spot script, a tiny model built from a config, offline) as
its detail page shows it: progress goes 0 → 100 % by the Trainer's own steps (ckptlib's step and
commit lines), never by a data-preparation bar ("Map", "Writing model shards") or the evaluation
bar (5/5), and the loss chart has every loss the Trainer logged (one every 2 steps: 100 points), an epoch axis and
a marker at each of the 10 committed checkpoints."""

from __future__ import annotations

import re

import pytest

from harness.browser import login, save_screenshot
from harness.processes import wait
from harness.sandbox import needs_sandbox

pytestmark = [pytest.mark.slow, needs_sandbox]

OWNER = ("trainer-progress-owner", "owner-pass-1")

SPOT = 'PYTHONPATH=$CHECKPOINT_VENDOR HF_DATASETS_OFFLINE="1" python /opt/examples/spot_train.py'
ENV = {
    "SPOT_MAX_STEPS": "200",
    "SPOT_SAVE_STEPS": "20",
    "SPOT_MAX_LENGTH": "16",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "OMP_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
SHOWN = re.compile(r"^(?:(?P<percent>[\d.]+)% · )?step (?P<step>\d+)/(?P<total>\d+)")

# Every text the progress line shows, recorded as it changes (not sampled by polling).
RECORD_PROGRESS = """() => {
  window.shownProgress = [];
  const text = document.querySelector("[data-progress-text]");
  const note = () => window.shownProgress.push(text.textContent.trim());
  note();
  new MutationObserver(note).observe(text, {childList: true, characterData: true, subtree: true});
}"""


def test_progress_and_the_loss_chart_follow_the_trainers_steps(users, page):
    console = users
    job = console.create_job(OWNER[0], "trainer-progress", SPOT, env=ENV)
    login(page, console, *OWNER)
    page.goto(f"{console.base_url}/training-jobs/{job['id']}/")
    page.evaluate(RECORD_PROGRESS)
    done = console.wait_for_job(job["id"], {"Completed", "Failed", "Pending - internalerror"}, timeout=3600)
    assert done["status"] == "Completed", done
    wait(lambda: page.evaluate("window.shownProgress")[-1].startswith("100% · step 200/200"), "the page at 100 %", timeout=60, interval=0.5)
    shown = [t for t in page.evaluate("window.shownProgress") if t]
    steps = [SHOWN.match(t) for t in shown if t.startswith(("step", *"0123456789"))]
    assert steps and all(m is not None for m in steps), shown
    # Only the Trainer's max_steps is ever a total: not Map's 400, the shards' 1/1 or evaluation's 5/5.
    assert {m["total"] for m in steps} == {"200"}, shown
    numbers = [int(m["step"]) for m in steps]
    assert numbers == sorted(numbers), shown  # never back to a bar's 0/5
    assert shown[-1].startswith("100% · step 200/200"), shown

    page.reload()
    chart = page.locator("[data-loss-chart]")
    wait(lambda: chart.get_attribute("data-point-count") is not None, "the loss chart drawn", timeout=30, interval=0.5)
    save_screenshot(page, "trainer-progress-loss-chart")
    assert chart.get_attribute("data-point-count") == "100"
    assert chart.get_attribute("data-last-step") == "200"
    # The Trainer logs its epoch with each loss: the chart has an epoch axis; every save is marked.
    assert chart.get_attribute("data-epoch-axis") == "shown" and float(chart.get_attribute("data-last-epoch")) > 0
    assert chart.get_attribute("data-checkpoint-markers") == "10"
    assert page.locator("[data-field='progress'] [data-progress-text]").first.inner_text().startswith("100% · step 200/200")
    assert page.js_errors == []
