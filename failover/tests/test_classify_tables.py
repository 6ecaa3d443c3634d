"""Unit tests of the classification tables: Xids, NVML findings, signatures, precedence."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from failover.classify import (
    FINDING_RULES,
    HARDWARE_PRIORITY,
    NON_HARDWARE_SIGNATURES,
    Verdict,
    classify_failure,
    parse_kernel_xids,
)
from failover.evidence import Finding, FindingKind
from failover.xids import XIDS

README = Path(__file__).resolve().parents[2] / "docs" / "failover.md"


def xid_line(xid: int, text: str = "event", pci: str = "0000:3b:00") -> str:
    return f"[ 100.000001] NVRM: Xid (PCI:{pci}): {xid}, pid=4242, name=python3, {text}"


def xid(code: int, gpu: int | None = 0, detail: str = "") -> Finding:
    return Finding(kind=FindingKind.XID, xid=code, gpu=gpu, detail=detail)


HARDWARE_XIDS = [code for code, rule in XIDS.items() if rule.cls == "hardware"]
APPLICATION_XIDS = [code for code, rule in XIDS.items() if rule.cls == "application"]


# --- Xid table -----------------------------------------------------------------------------------


@pytest.mark.parametrize("code", HARDWARE_XIDS)
def test_a_hardware_class_xid_in_the_kernel_log_is_a_hardware_fault(code):
    verdict = classify_failure(exit_code=1, kernel_log=xid_line(code))

    assert verdict.hardware
    assert verdict.reason.startswith(f"Xid {code} on PCI 0000:3b:00: ")
    assert verdict.evidence["source"] == "kernel_log"
    assert verdict.evidence["xid"] == code


@pytest.mark.parametrize("code", HARDWARE_XIDS)
def test_a_hardware_class_xid_from_nvml_names_the_gpu(code):
    verdict = classify_failure(findings=[xid(code, gpu=2)])

    assert verdict.hardware
    assert verdict.reason.startswith(f"Xid {code} on GPU 2: ")
    assert verdict.evidence == {"source": "nvml", "xid": code, "gpu": 2}


def test_it_reports_xid_79_as_the_issue_example_shows():
    verdict = classify_failure(findings=[xid(79, gpu=2)])

    assert verdict.reason == "Xid 79 on GPU 2: GPU has fallen off the bus"
    assert verdict.verdict == "hardware"


@pytest.mark.parametrize("code", APPLICATION_XIDS)
def test_an_application_class_xid_alone_is_not_a_hardware_fault(code):
    verdict = classify_failure(exit_code=1, kernel_log=xid_line(code))

    assert not verdict.hardware
    assert f"Xid {code}" in verdict.reason
    assert "application-class" in verdict.reason


@pytest.mark.parametrize("code", APPLICATION_XIDS)
@pytest.mark.parametrize(
    "evidence",
    [
        Finding(kind=FindingKind.ECC_UNCORRECTED, gpu=0, value=2),
        Finding(kind=FindingKind.REMAP_PENDING, gpu=0),
        Finding(kind=FindingKind.REMAP_FAILURE, gpu=0),
        xid(48),
        xid(94),
        xid(95),
    ],
    ids=lambda f: f.kind if f.kind != "xid" else f"xid{f.xid}",
)
def test_an_application_class_xid_with_ecc_or_remap_evidence_is_hardware(code, evidence):
    verdict = classify_failure(exit_code=1, kernel_log=xid_line(code), findings=[evidence])

    assert verdict.hardware


def test_xid_63_alone_is_not_hardware():
    verdict = classify_failure(kernel_log=xid_line(63, "Row Remapper: New row marked for remapping, reset gpu to activate."))

    assert not verdict.hardware
    assert verdict.reason.startswith("Xid 63 on PCI 0000:3b:00")
    assert "no failed remap" in verdict.reason


@pytest.mark.parametrize(
    "evidence",
    [[Finding(kind=FindingKind.REMAP_FAILURE, gpu=1)], [xid(64)]],
    ids=["remap_failure", "xid64"],
)
def test_xid_63_with_a_failed_remap_is_hardware(evidence):
    assert classify_failure(findings=[xid(63), *evidence]).hardware


def test_xid_63_with_a_pending_remap_is_not_hardware():
    # The row was marked and waits for a reset: the remap worked, the run was not its victim.
    verdict = classify_failure(exit_code=1, findings=[xid(63), Finding(kind=FindingKind.REMAP_PENDING, gpu=0)])
    assert not verdict.hardware and "no failed remap" in verdict.reason


def test_xid_109_is_a_gpu_reset_as_the_catalogue_says():
    verdict = classify_failure(kernel_log=xid_line(109, "Ch 00000008, errorString CTX SWITCH TIMEOUT"))
    assert verdict.hardware and verdict.reason.startswith("Xid 109 on PCI 0000:3b:00: context-switch timeout")


def test_xid_121_a_corrected_c2c_error_is_no_evidence():
    assert not classify_failure(exit_code=1, kernel_log=xid_line(121, "C2C link corrected error")).hardware


@pytest.mark.parametrize("code", [46, 62, 64, 109, 110, 119, 120, 136, 140, 143, 151, 155, 156, 158, 163, 166, 167, 169, 172, 173])
def test_xids_whose_catalogued_resolution_is_a_reset_or_reboot_are_hardware(code):
    assert classify_failure(exit_code=1, kernel_log=xid_line(code)).hardware


@pytest.mark.parametrize("action", [5, 6, 7])
def test_the_newer_recovery_actions_are_hardware(action):
    verdict = classify_failure(findings=[Finding(kind=FindingKind.RECOVERY_ACTION, gpu=0, value=action)])
    assert verdict.hardware and "action" not in verdict.reason.split(": ", 1)[1]


@pytest.mark.parametrize(
    "line",
    [
        "Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error",
        "RuntimeError: GPU has fallen off the bus",
    ],
)
def test_an_unreachable_gpu_in_the_run_log_is_hardware(line):
    assert classify_failure(exit_code=1, log_lines=[line]).hardware


@pytest.mark.parametrize(
    "line",
    [
        "RuntimeError: CUDA error: CUDA_ERROR_CONTAINED",
        "torch.AcceleratorError: CUDA error: cudaErrorContained: Invalid access of peer GPU memory over nvlink or a hardware error",
    ],
)
def test_a_contained_error_is_hardware_only_with_node_evidence(line):
    assert not classify_failure(exit_code=1, log_lines=[line]).hardware
    assert classify_failure(exit_code=1, log_lines=[line], findings=[Finding(kind=FindingKind.PCIE_REPLAY, gpu=0, value=3)]).hardware


@pytest.mark.parametrize(
    "line",
    [
        "NVRM: Timeout waiting for RPC from GSP0! Expected function 76 (GSP_RM_CONTROL) (0x20801348 0x4).",
        "NVRM: _kgspLogXid119: ********************************* GSP Timeout **********************************",
    ],
)
def test_gsp_timeouts_in_the_kernel_log_are_hardware(line):
    verdict = classify_failure(exit_code=1, kernel_log=line)
    assert verdict.hardware and verdict.evidence["signature"] == "gsp_timeout"


def test_xid_63_is_not_upgraded_by_unrelated_supporting_evidence():
    verdict = classify_failure(findings=[xid(63), Finding(kind=FindingKind.PCIE_REPLAY, gpu=0, value=12)])

    assert not verdict.hardware


def test_xid_154_is_hardware_unless_the_new_recovery_action_is_none():
    to_reset = "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"
    back_to_none = "GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)"

    assert classify_failure(kernel_log=xid_line(154, to_reset)).reason.endswith("to GPU Reset Required")
    assert not classify_failure(kernel_log=xid_line(154, back_to_none)).hardware


def test_unlisted_xids_are_not_evidence():
    verdict = classify_failure(exit_code=1, kernel_log=xid_line(1, "channel error"))  # catalogue: "Unused"

    assert not verdict.hardware
    assert verdict.reason == "exit code 1"


def test_the_most_serious_xid_is_reported_when_several_apply():
    kernel_log = "\n".join([xid_line(13), xid_line(45), xid_line(74), xid_line(79)])

    assert classify_failure(kernel_log=kernel_log).evidence["xid"] == 79


# --- NVML findings -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("finding", "expected_reason"),
    [
        (Finding(kind=FindingKind.GPU_LOST, gpu=3, detail="NVML: GPU is lost"), "GPU is lost on GPU 3"),
        (Finding(kind=FindingKind.RESET_REQUIRED, gpu=1), "GPU requires a reset on GPU 1"),
        (Finding(kind=FindingKind.GPU_COUNT, value=7, expected=8, detail="fewer GPUs than expected"), "Only 7 of 8 GPUs visible"),
        (Finding(kind=FindingKind.GPU_COUNT), "Fewer GPUs visible than expected"),
        (Finding(kind=FindingKind.ECC_UNCORRECTED, gpu=0, value=3), "3 uncorrected ECC error(s) on GPU 0"),
        (Finding(kind=FindingKind.REMAP_FAILURE, gpu=5), "Row-remapping failure on GPU 5"),
        (Finding(kind=FindingKind.NVLINK_DOWN, gpu=2, value=7), "NVLink link 7 down on GPU 2"),
        (Finding(kind=FindingKind.NETWORK_LINK, detail="mlx5_0 port 1 DOWN"), "InfiniBand / RoCE port down (mlx5_0 port 1 DOWN)"),
        (Finding(kind=FindingKind.THERMAL, gpu=0, detail="hw_thermal_slowdown"), "Hardware thermal slowdown / shutdown on GPU 0 (hw_thermal_slowdown)"),
        (Finding(kind=FindingKind.RECOVERY_ACTION, gpu=0, value=1, detail="driver recovery action 1"), "Driver recovery action: GPU reset required on GPU 0"),
        (Finding(kind=FindingKind.RECOVERY_ACTION, gpu=0, detail="DRAIN_P2P"), "Driver recovery action: DRAIN_P2P on GPU 0"),
    ],
    ids=lambda value: value.kind if isinstance(value, Finding) else "",
)
def test_a_hardware_finding_by_itself_is_a_hardware_fault(finding, expected_reason):
    verdict = classify_failure(exit_code=1, findings=[finding])

    assert verdict.hardware
    assert verdict.reason == expected_reason
    assert verdict.evidence["source"] == "nvml"
    assert verdict.evidence["kind"] == finding.kind


@pytest.mark.parametrize(
    "finding",
    [
        Finding(kind=FindingKind.GPU_COUNT, value=8, expected=8),
        Finding(kind=FindingKind.ECC_UNCORRECTED, gpu=0, value=0),
        Finding(kind=FindingKind.RECOVERY_ACTION, gpu=0, detail="NONE"),
        Finding(kind=FindingKind.RECOVERY_ACTION, gpu=0, value=0),
        Finding(kind=FindingKind.THERMAL, gpu=0, detail="sw_thermal_slowdown"),
        Finding(kind="unknown", gpu=0, detail="NVMLError_Unknown"),
    ],
    ids=["gpu_count_complete", "ecc_zero", "recovery_none", "recovery_zero", "sw_thermal", "unknown_kind"],
)
def test_a_nominal_reading_is_not_evidence(finding):
    assert not classify_failure(exit_code=1, findings=[finding]).hardware


@pytest.mark.parametrize(
    "kind",
    [FindingKind.REMAP_PENDING, FindingKind.RETIRED_PAGES_PENDING, FindingKind.PCIE_REPLAY, FindingKind.PCIE_LINK_DEGRADED, FindingKind.NVLINK_ERRORS],
)
def test_supporting_evidence_alone_is_not_a_hardware_fault_but_is_recorded(kind):
    verdict = classify_failure(exit_code=1, findings=[Finding(kind=kind, gpu=0)])

    assert not verdict.hardware
    assert verdict.reason == "exit code 1"
    assert verdict.evidence["supporting"] == [{"kind": kind, "gpu": 0, "source": "nvml"}]


@pytest.mark.parametrize(
    "log",
    [
        "RuntimeError: CUDA error: an illegal memory access was encountered",
        "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE) ran for 600013 milliseconds",
        "NCCL WARN NET/IB : Got completion from peer 10.0.0.2<1234> with status=12 opcode=0 len=0 vendor err 129 (Recv)",
    ],
    ids=["illegal_memory_access", "nccl_timeout", "ib_completion"],
)
def test_an_ambiguous_failure_becomes_hardware_only_with_node_evidence(log):
    support = Finding(kind=FindingKind.NVLINK_ERRORS, gpu=4, value=17)

    alone = classify_failure(exit_code=1, log_lines=[log])
    with_support = classify_failure(exit_code=1, log_lines=[log], findings=[support])

    assert not alone.hardware
    assert "no node evidence" in alone.reason
    assert with_support.hardware
    assert with_support.reason.endswith("with node evidence: NVLink error counters grew on GPU 4")


def test_a_bare_nccl_timeout_with_a_kernel_xid_79_is_hardware():
    verdict = classify_failure(
        exit_code=1,
        log_lines=["[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1) ran for 1800000 ms"],
        kernel_log=xid_line(79, "GPU has fallen off the bus."),
    )

    assert verdict.hardware
    assert verdict.evidence["xid"] == 79


# --- the run's own output --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        "RuntimeError: CUDA error: uncorrectable ECC error encountered",
        "torch.AcceleratorError: CUDA error: uncorrectable ECC error encountered",
        "failed call to cuDevicePrimaryCtxRetain: CUDA_ERROR_ECC_UNCORRECTABLE: uncorrectable ECC error encountered",
        "Unable to determine the device handle for GPU 0000:02:00.0: GPU is lost. Reboot the system to recover this GPU",
        "pynvml.NVMLError_GPUIsLost: GPU is lost",
        "NVRM: GPU 0000:09:00.0: GPU has fallen off the bus.",
        "RuntimeError: CUDA error: uncorrectable NVLink error detected during the execution",
        "NCCL WARN NET/IB : Got async event : port error",
    ],
)
def test_an_unambiguous_hardware_signature_in_the_run_log_is_hardware(line):
    verdict = classify_failure(exit_code=1, log_lines=["step 100 loss 1.23", line])

    assert verdict.hardware
    assert verdict.reason.startswith("run log: ")
    assert verdict.evidence["source"] == "log"
    assert verdict.evidence["matched"] == line


@pytest.mark.parametrize(
    "lines",
    [
        ["NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/NVLink", "Using NVLink for all-reduce"],
        ["ECC mode enabled on all GPUs", "| GPU  Name   Persistence-M| Bus-Id   Disp.A | Volatile Uncorr. ECC |"],
        ["INFO checking GPU health", "GPU 0: NVIDIA H100 80GB HBM3"],
        ["ValueError: expected the GPU is lost flag to be a bool"],
        ["RuntimeError: my watchdog thinks the GPU has fallen off the bus"],
    ],
    ids=["nvlink_mention", "ecc_mention", "gpu_mention", "user_error_quotes_gpu_lost", "user_error_quotes_bus"],
)
def test_a_bare_mention_of_a_component_is_no_evidence(lines):
    assert not classify_failure(exit_code=1, log_lines=lines).hardware


def test_a_hardware_phrase_in_the_users_own_source_line_is_ignored():
    lines = [
        "Traceback (most recent call last):",
        '  File "train.py", line 12, in <module>',
        '    raise SystemExit("uncorrectable ECC error encountered")  # test fixture',
        "SystemExit: 3",
    ]

    assert not classify_failure(exit_code=3, log_lines=lines).hardware


def test_node_evidence_wins_over_a_non_hardware_reason_in_the_log():
    verdict = classify_failure(
        exit_code=1,
        log_lines=["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"],
        findings=[Finding(kind=FindingKind.GPU_LOST, gpu=1)],
    )

    assert verdict.hardware
    assert verdict.evidence["kind"] == FindingKind.GPU_LOST


# --- non-hardware reasons ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lines", "reason"),
    [
        (["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB"], "CUDA out of memory"),
        (
            ["Traceback (most recent call last):", '  File "train.py", line 1, in <module>', "    import foo", "ModuleNotFoundError: No module named 'foo'"],
            "ModuleNotFoundError: No module named 'foo'",
        ),
        (["ImportError: cannot import name 'Trainer' from 'transformers'"], "ImportError: cannot import name 'Trainer' from 'transformers'"),
        (["SyntaxError: invalid syntax"], "SyntaxError: invalid syntax"),
        (
            ["FileNotFoundError: [Errno 2] No such file or directory: 'data/train.jsonl'"],
            "FileNotFoundError: [Errno 2] No such file or directory: 'data/train.jsonl'",
        ),
        (["PermissionError: [Errno 13] Permission denied: '/output'"], "PermissionError: [Errno 13] Permission denied: '/output'"),
        (["usage: train.py [-h] [--lr LR]", "train.py: error: unrecognized arguments: --lrr 3e-4"], "train.py: error: unrecognized arguments: --lrr 3e-4"),
        (
            ["RuntimeError: Error(s) in loading state_dict for GPT:", "\tsize mismatch for wte.weight: copying a param"],
            "shape mismatch loading a checkpoint (state_dict)",
        ),
        (["step 1200 loss is nan, stopping"], "NaN / infinite loss"),
        (["RuntimeError: CUDA error: device-side assert triggered"], "device-side assert triggered"),
        (["[rank0]: KeyError: 'input_ids'"], "KeyError: 'input_ids'"),
    ],
)
def test_it_gives_the_most_specific_internal_error(lines, reason):
    verdict = classify_failure(exit_code=1, log_lines=lines)

    assert not verdict.hardware
    assert verdict.reason == reason
    assert verdict.evidence["exit_code"] == 1


def test_a_cuda_oom_outranks_the_nccl_timeout_it_caused():
    lines = [
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9) ran for 600000 ms",
    ]

    assert classify_failure(exit_code=1, log_lines=lines).reason == "CUDA out of memory"


def test_the_childs_exception_outranks_the_launchers_wrapper():
    lines = ["ValueError: batch_size must be positive", "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: "]

    assert classify_failure(exit_code=1, log_lines=lines).reason == "ValueError: batch_size must be positive"


@pytest.mark.parametrize(
    ("exit_code", "exit_signal", "reason"),
    [
        (1, None, "exit code 1"),
        (127, None, "exit code 127"),
        (137, None, "killed by SIGKILL (host OOM kill?)"),
        (-9, None, "killed by SIGKILL (host OOM kill?)"),
        (None, 9, "killed by SIGKILL (host OOM kill?)"),
        (139, None, "segmentation fault (SIGSEGV)"),
        (None, 6, "aborted (SIGABRT)"),
        (0, None, "exited 0 (no failure)"),
        (None, None, "no hardware fault signal"),
    ],
)
def test_exit_codes_on_a_healthy_node_are_internal_errors(exit_code, exit_signal, reason):
    verdict = classify_failure(exit_code=exit_code, exit_signal=exit_signal)

    assert not verdict.hardware
    assert verdict.reason == reason


def test_a_host_oom_kill_in_the_kernel_log_is_named():
    verdict = classify_failure(exit_signal=9, kernel_log="[12.3] Out of memory: Killed process 4242 (python3) total-vm:53312244kB")

    assert verdict.reason == "killed by SIGKILL (host OOM kill?)"
    assert verdict.evidence["exit_signal"] == 9


# --- parsing, API ---------------------------------------------------------------------------------


def test_parse_kernel_xids_reads_nvrm_lines():
    kernel_log = "\n".join(
        [
            "[ 1.0] usb 1-1: new high-speed USB device",
            "[ 2.0] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.",
            "kernel: NVRM: Xid (PCI:0000:dc:00): 45, pid=18, name=python3, Ch 00000001 caused by previous Xid 149",
            "[ 3.0] NVRM: Xid (0000:03:00): 14, Channel 00000001",
        ]
    )

    findings = parse_kernel_xids(kernel_log)

    assert [f.xid for f in findings] == [79, 45, 149, 14]
    assert all(f.kind == FindingKind.XID and f.gpu is None for f in findings)
    assert findings[0].detail == "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."


def test_parse_kernel_xids_of_nothing_is_empty():
    assert parse_kernel_xids("") == []
    assert parse_kernel_xids("[0.0] Linux version 6.8.0") == []


def test_a_verdict_is_frozen_json_serialisable_and_names_its_class():
    verdict = classify_failure(exit_code=1, kernel_log=xid_line(48))

    assert isinstance(verdict, Verdict)
    assert verdict.verdict == "hardware"
    assert json.loads(json.dumps(verdict.to_dict()))["verdict"] == "hardware"
    with pytest.raises(AttributeError):
        verdict.hardware = False  # type: ignore[misc]


def test_log_lines_may_be_passed_as_one_string():
    verdict = classify_failure(exit_code=1, log_lines="step 1\nModuleNotFoundError: No module named 'foo'")

    assert verdict.reason == "ModuleNotFoundError: No module named 'foo'"


def test_every_hardware_rule_has_a_place_in_the_priority_order():
    keys = set(HARDWARE_PRIORITY)
    for code, rule in XIDS.items():
        assert rule.cls == "ignore" or f"xid:{code}" in keys
    for kind, cls, _ in FINDING_RULES:
        if cls == "hardware":
            assert f"finding:{kind}" in keys


def test_the_documented_tables_list_every_rule():
    readme = README.read_text(encoding="utf-8")
    start = readme.index("### How a failure is judged")
    end = readme.find("\n## ", start)
    text = readme[start : end if end >= 0 else None]
    hardware_part, internal_part = text.split("### Errors judged internal errors")

    for code, rule in XIDS.items():
        if rule.cls != "ignore":
            assert re.search(rf"^\| {code} \|", hardware_part, re.M), f"Xid {code} missing from docs/failover.md"
    for kind, _, _ in FINDING_RULES:
        assert f"`{kind}`" in text, f"finding kind {kind} missing from docs/failover.md"
    for name, *_ in NON_HARDWARE_SIGNATURES:
        assert f"`{name}`" in internal_part, f"signature {name} missing from docs/failover.md"


def test_the_nccl_infiniband_decision_an_ib_completion_error_is_hardware_only_with_the_nics_own_evidence():
    """docs/failover.md, "NCCL InfiniBand errors: the decision"."""
    line = "NCCL WARN NET/IB : Got completion from peer 10.0.0.2<1234> with status=12 opcode=0 len=0 vendor err 129 (Recv)"
    alone = classify_failure(exit_code=1, log_lines=[line])
    with_link_down = classify_failure(exit_code=1, log_lines=[line], kernel_log="mlx5_core 0000:5e:00.0 mlx5_0: Link down")
    with_port_down = classify_failure(exit_code=1, log_lines=[line], findings=[Finding(kind=FindingKind.NETWORK_LINK, detail="mlx5_0 port 1 down")])

    assert not alone.hardware and "NCCL network (IB) completion error" in alone.reason
    assert with_link_down.hardware and "link down" in with_link_down.reason
    assert with_port_down.hardware


def test_a_script_pasted_with_a_path_relative_to_the_repository_says_where_the_command_starts():
    """`python examples/spot_train.py` copied from docs/ckptlib.md: python cannot open it in /job/work."""
    line = "python: can't open file '/job/work/examples/spot_train.py': [Errno 2] No such file or directory"
    verdict = classify_failure(exit_code=2, log_lines=[line])

    assert not verdict.hardware
    assert "/job/work" in verdict.reason and "python /opt/examples/spot_train.py" in verdict.reason
