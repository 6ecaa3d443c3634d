"""Agreement with the public peers on their own test data (``corpus/peers.json``, built by
``corpus/build_peers.py`` from leptonai/gpud, NVIDIA/DCGM, NVIDIA/k8s-device-plugin and
NVIDIA/nvidia-resiliency-ext at fixed commits; each case names its source line).

A device-health case (gpud, DCGM, k8s-device-plugin) is scored by whether the product takes the GPU
or node out of placement (``node_fault``); a run case (NVRx) by whether it fails the run over
(``classify_failure``). The figure per peer is printed with the test's output."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from failover.classify import HARDWARE, NON_HARDWARE, classify_failure, node_fault
from failover.evidence import Finding, FindingKind

CORPUS = json.loads((Path(__file__).parent / "corpus" / "peers.json").read_text(encoding="utf-8"))
CASES = CORPUS["cases"]
TARGET = 0.98


def judge(case: dict) -> str:
    findings = [Finding.from_dict(f) for f in case["findings"]]
    if case["judges"] == "node":
        return HARDWARE if node_fault(findings=findings, kernel_log=case["kernel_log"]) is not None else NON_HARDWARE
    verdict = classify_failure(exit_code=1, kernel_log=case["kernel_log"], log_lines=case["log"].splitlines(), findings=findings)
    return verdict.verdict


def agreement() -> tuple[dict[str, list[int]], list[str]]:
    per_peer: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    misses = []
    for case in CASES:
        got = judge(case)
        per_peer[case["peer"]][1] += 1
        if got == case["expected"]:
            per_peer[case["peer"]][0] += 1
        else:
            misses.append(f"{case['id']}: judged {got}, expected {case['expected']} ({case['why']}) {case['source']}")
    return per_peer, misses


def test_the_product_agrees_with_the_peers_on_their_own_test_data(capsys):
    per_peer, misses = agreement()
    agreed = sum(a for a, _ in per_peer.values())
    with capsys.disabled():
        print("\nagreement with the peers (or NVIDIA's catalogue where it overrides one):")
        for peer, (a, n) in sorted(per_peer.items()):
            print(f"  {peer:18} {a:3}/{n:<3} {a / n:6.1%}")
        print(f"  {'all':18} {agreed:3}/{len(CASES):<3} {agreed / len(CASES):6.1%}")
        overrides = sum(bool(c["override"]) for c in CASES)
        raw = sum(judge(c) == c["peer_label"] for c in CASES)
        print(f"  with the peers' own labels (no catalogue override, {overrides} cases differ): {raw}/{len(CASES)}")
        for miss in misses:
            print("  miss:", miss)
    assert len(CASES) >= 100
    assert agreed / len(CASES) >= TARGET, misses


def test_every_case_names_its_source_at_a_commit_and_says_why():
    ids = [case["id"] for case in CASES]
    assert len(ids) == len(set(ids))
    for case in CASES:
        assert case["source"].startswith("https://github.com/") and "/blob/" in case["source"] and "#L" in case["source"], case["id"]
        assert case["why"] and case["judges"] in ("node", "run")
        assert case["expected"] in (HARDWARE, NON_HARDWARE) and case["peer_label"] in (HARDWARE, NON_HARDWARE)
        assert (case["expected"] != case["peer_label"]) == bool(case["override"]), case["id"]
        for finding in case["findings"]:
            assert finding["kind"] in FindingKind.ALL
    assert {case["peer"] for case in CASES} == {"gpud", "DCGM", "k8s-device-plugin", "NVRx"}
