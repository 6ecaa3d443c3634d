"""The Nodes page follows a fault without a reload: right after "Inject" the fault is pending, then
the GPU shows Unhealthy and the fault applied; "Mark healthy" shows only on an unhealthy node."""

from __future__ import annotations

import pytest

from harness.browser import BACKEND, login, save_screenshot
from harness.processes import wait

pytestmark = pytest.mark.slow

OPERATOR = ("nodes-live-operator", "operator-pass-1")


def test_an_injected_fault_shows_on_the_nodes_page_without_a_reload(users, page):
    console = users
    login(page, console, *OPERATOR)
    page.goto(f"{console.base_url}/nodes/")
    sections = page.locator("section[data-node]")
    node = sections.last.get_attribute("data-node")
    section = page.locator(f"section[data-node='{node}']")
    for name in sections.evaluate_all("all => all.map(s => s.dataset.node)"):
        # "Healthy": the node and every GPU of it (an earlier test may have left a GPU unhealthy).
        healthy = page.locator(f"section[data-node='{name}'] [data-field='health']").inner_text().strip() == "Healthy"
        if healthy:
            assert page.locator(f"section[data-node='{name}'] [data-action='clear']").count() == 0, f"Mark healthy on healthy {name}"
    page.on("dialog", lambda dialog: dialog.accept())
    try:
        section.get_by_label("Fault", exact=True).select_option("xid")
        section.get_by_label("GPU", exact=True).select_option("0")
        section.get_by_label("Xid").fill("79")
        section.get_by_role("button", name=f"Inject into {node}").click()
        page.wait_for_selector(".message--success:has-text('Injected')")
        page.evaluate("() => { window.__noReload = 'same page'; }")

        gpu0 = section.locator("tr[data-gpu='0']")
        wait(lambda: "Unhealthy" in gpu0.inner_text(), "GPU 0 to show Unhealthy", timeout=20)
        # An Xid 79 takes that GPU out, not the node: its header says so.
        wait(lambda: section.locator("[data-field='health']").inner_text().strip() == "1 GPU unhealthy", "the node's '1 GPU unhealthy'", timeout=20)
        wait(lambda: "applied" in section.locator("[data-node-region='jobs']").inner_text(), "the fault applied", timeout=10)
        assert "pending" not in section.locator("[data-node-region='jobs']").inner_text()
        assert section.locator("[data-action='clear']").inner_text().strip().startswith("Mark healthy")
        assert page.evaluate("window.__noReload") == "same page"
        if BACKEND == "slurm":
            # The fault drained the node in Slurm, with its reason, shown live.
            badge = section.locator("[data-field='backend']")
            wait(lambda: "DRAIN" in badge.inner_text(), "the node drained in Slurm", timeout=20)
            assert "Xid 79" in section.locator("[data-field='backend-reason']").inner_text()
        else:
            assert section.locator("[data-field='backend']").count() == 0
        save_screenshot(page, f"nodes-page-after-fault-{BACKEND}", full_page=True)

        section.locator("[data-action='clear']").click()
        page.wait_for_selector(".message--success:has-text('cleared')")
        wait(lambda: "Unhealthy" not in section.locator("tr[data-gpu='0']").inner_text(), "GPU 0 healthy again", timeout=20)
        assert section.locator("[data-action='clear']").count() == 0
        if BACKEND == "slurm":  # Mark healthy returned it to Slurm
            wait(lambda: "DRAIN" not in section.locator("[data-field='backend']").inner_text(), "the node resumed in Slurm", timeout=20)
        assert page.js_errors == []
    finally:
        console.shell(f"from jobs.models import Node; from failover.services.faults import clear_node; clear_node(Node.objects.get(name={node!r}))")
