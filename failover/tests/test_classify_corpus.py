"""The classification tables against real-world failure excerpts, each with its public source.

``corpus/cases.json`` holds trimmed quotes from public issues, forums and documentation; each case
records what the platform should decide and why. A case id appears in its test id.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from failover.classify import HARDWARE, NON_HARDWARE, classify_failure
from failover.evidence import Finding, FindingKind

CORPUS_PATH = Path(__file__).parent / "corpus" / "cases.json"
CASES = json.loads(CORPUS_PATH.read_text(encoding="utf-8"))["cases"]


def _sources(case: dict) -> list[str]:
    return case["source"] if isinstance(case["source"], list) else [case["source"]]


def classify_case(case: dict):
    return classify_failure(
        exit_code=case["exit_code"],
        exit_signal=case["exit_signal"],
        kernel_log=case["kernel_log"],
        log_lines=case["log"].splitlines(),
        findings=[Finding.from_dict(f) for f in case["findings"]],
    )


@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
def test_each_real_world_failure_gets_the_expected_verdict(case):
    verdict = classify_case(case)

    assert verdict.verdict == case["expected"], f"{case['id']}: {verdict.reason} ({case['why']})"
    assert verdict.reason
    json.dumps(verdict.evidence)  # stored as JSON by the failover history


def test_the_corpus_has_at_least_sixty_cases_roughly_balanced():
    hardware = sum(case["expected"] == HARDWARE for case in CASES)
    non_hardware = sum(case["expected"] == NON_HARDWARE for case in CASES)

    assert hardware + non_hardware == len(CASES) >= 60
    assert 0.4 <= hardware / len(CASES) <= 0.6


def test_every_case_cites_a_public_source_and_says_why():
    for case in CASES:
        assert _sources(case), case["id"]
        for url in _sources(case):
            assert url.startswith("https://"), (case["id"], url)
        assert case["why"].strip(), case["id"]
        assert case["log"] or case["kernel_log"] or case["findings"], case["id"]


def test_case_ids_are_unique_and_findings_are_valid():
    ids = [case["id"] for case in CASES]
    assert len(ids) == len(set(ids))
    for case in CASES:
        for finding in case["findings"]:
            assert finding["kind"] in FindingKind.ALL, case["id"]


@pytest.mark.parametrize(
    "case_id",
    [
        "nccl-timeout-bare",
        "nccl-timeout-plus-kernel-xid79",
        "illegal-memory-access-no-node-evidence",
        "device-side-assert-bad-label",
        "cuda-oom-small-gpu",
        "nan-loss-detectron2",
        "xid13-alone-graphics-exception",
        "xid63-without-remap-evidence",
        "xid63-with-remap-pending",
        "host-oom-killer",
    ],
)
def test_the_corpus_covers_the_tricky_cases(case_id):
    assert case_id in {case["id"] for case in CASES}
