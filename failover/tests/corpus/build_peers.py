"""Build ``peers.json``: failure cases taken from public peers' own test data, each with the peer's
label and its source at a fixed commit (standard library only; run by hand, not by the tests).

    python failover/tests/corpus/build_peers.py GPUD DCGM NVRX K8S > failover/tests/corpus/peers.json

GPUD, DCGM, NVRX, K8S: git directories of leptonai/gpud, NVIDIA/DCGM, NVIDIA/nvidia-resiliency-ext and
NVIDIA/k8s-device-plugin (the ``fetch`` mirrors, bare: files are read with ``git show``).

What each peer labels, and so what a case is scored against:

* gpud, DCGM, k8s-device-plugin judge a *device*: the case is a node-side reading (a kernel line or an
  NVML-shaped finding) and is scored against ``failover.classify.node_fault`` (does the product take the
  GPU or node out of placement). gpud's label: its event type for the line (``Fatal`` = unhealthy; the
  Xid's own event type where its test gives none); DCGM's: the health result its test asserts (FAIL =
  unhealthy, WARN / PASS = not); k8s-device-plugin's: the Xids its health check skips as application
  errors are healthy.
* NVRx judges a *run*: the case is a run log, scored against ``classify_failure`` (fail over or not);
  ``gpu_hardware_fault`` / ``gpu_device_loss`` are infrastructure (fail over), every other class not.

``expected`` is the peer's label, except where NVIDIA's Xid catalogue (``failover/catalog/nvidia.json``)
decides otherwise; such a case says why in ``override``.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys

GPUD_URL = "https://github.com/leptonai/gpud/blob/{commit}/{path}#L{line}"
DCGM_URL = "https://github.com/NVIDIA/DCGM/blob/{commit}/{path}#L{line}"
NVRX_URL = "https://github.com/NVIDIA/nvidia-resiliency-ext/blob/{commit}/{path}#L{line}"
K8S_URL = "https://github.com/NVIDIA/k8s-device-plugin/blob/{commit}/{path}#L{line}"


def show(repo: str, path: str) -> tuple[str, str]:
    commit = subprocess.run(["git", "-C", repo, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    text = subprocess.run(["git", "-C", repo, "show", f"HEAD:{path}"], capture_output=True, text=True, check=True).stdout
    return commit, text


def line_of(text: str, needle: str) -> int:
    at = text.find(needle)
    return text.count("\n", 0, at) + 1 if at >= 0 else 1


def case(cid, peer, source, *, judges, peer_label, kernel_log="", log="", findings=(), override="", why=""):
    expected = peer_label
    if override:
        expected = "hardware" if peer_label == "non-hardware" else "non-hardware"
    return {
        "id": cid,
        "peer": peer,
        "source": source,
        "judges": judges,
        "kernel_log": kernel_log,
        "log": log,
        "findings": list(findings),
        "peer_label": peer_label,
        "expected": expected,
        "override": override,
        "why": why,
    }


# Where NVIDIA's catalogue decides otherwise than gpud's event type (code -> why).
GPUD_OVERRIDES = {
    63: "catalogue IGNORE / IGNORE: a row remap pending is Xid 63's normal outcome (the GPU needs a reset at its next idle)",
    94: "catalogue RESTART_APP: a contained error ends the application, the GPU needs nothing (DCGM: WARN, not isolate)",
    154: "catalogue XID_154: follow the new recovery action; 'GPU Reset Required' is a GPU reset",
}


def gpud_cases(repo: str) -> list[dict]:
    out = []
    path = "components/accelerator/nvidia/xid/nvlink_logs_test.go"
    commit, text = show(repo, path)
    for name, line, event in re.findall(r'\{"(\w+)", "(NVRM: Xid[^"]+)", apiv1\.EventType(\w+)\}', text):
        label = "hardware" if event == "Fatal" else "non-hardware"
        printed = re.search(r"\b(Nonfatal|Fatal)\b", line)[1]
        override = ""
        if label == "non-hardware" and printed == "Fatal":
            override = (
                "the driver printed Fatal and the catalogue's 144-150 decode table gives this unit's status "
                "RESET_GPU / Fatal (gpud's unit pattern [A-Z_]+ misses the digit of TLW_*_PIPE0/1 and falls back)"
            )
        out.append(
            case(
                f"gpud-nvlink-{name}",
                "gpud",
                GPUD_URL.format(commit=commit, path=path, line=line_of(text, line)),
                judges="node",
                peer_label=label,
                kernel_log=line,
                override=override,
                why=f"gpud Test_NVLinkLogCoverage: EventType{event}",
            )
        )
    # Every other distinct Xid line of gpud's tests, labelled by gpud's event type for its Xid.
    _details_commit, details = show(repo, "components/accelerator/nvidia/xid/xid.go")
    events = {
        int(code): (re.search(r"EventType:\s+apiv1\.EventType(\w+)", body) or [None, None])[1]
        for code, body in re.findall(r"^\t(\d+): \{\n(.*?)^\t\},", details, re.S | re.M)
    }
    seen: set[str] = set()
    for path in (
        "components/accelerator/nvidia/xid/kmsg_test.go",
        "components/accelerator/nvidia/xid/component_test.go",
        "components/accelerator/nvidia/xid/health_state_test.go",
        "components/accelerator/nvidia/xid/mock_xid_test.go",
    ):
        commit, text = show(repo, path)
        for line in re.findall(r'"((?:\[[^\]"]*\] )?NVRM: Xid \(PCI:[0-9a-f:]+\): (\d+), [^"%]*)"', text):
            raw, code = line[0], int(line[1])
            if 144 <= code <= 150 or raw in seen:
                continue  # NVLink5 lines: the labelled coverage test above
            seen.add(raw)
            event = events.get(code)
            label = "hardware" if event == "Fatal" else "non-hardware"
            override = GPUD_OVERRIDES.get(code, "")
            if code == 154 and "to 0x0 (None)" in raw:
                override = ""
            out.append(
                case(
                    f"gpud-xid{code}-{len(out)}",
                    "gpud",
                    GPUD_URL.format(commit=commit, path=path, line=line_of(text, raw)),
                    judges="node",
                    peer_label=label,
                    kernel_log=raw,
                    override=override,
                    why=f"gpud's event type for Xid {code}: {event or 'unknown Xid (no event)'}",
                )
            )
    path = "components/accelerator/nvidia/xid/testdata/dmesg-with-xid-119.log"
    commit, text = show(repo, path)
    out.append(
        case(
            "gpud-dmesg-xid119",
            "gpud",
            GPUD_URL.format(commit=commit, path=path, line=1),
            judges="node",
            peer_label="hardware",
            kernel_log=text,
            why="gpud testdata: a dmesg with GSP RPC timeouts (Xid 119: Fatal)",
        )
    )
    path = "components/accelerator/nvidia/sxid/kmsg_test.go"
    commit, text = show(repo, path)
    _, sxids = show(repo, "components/accelerator/nvidia/sxid/sxid.go")
    seen = set()
    for raw in re.findall(r'input:\s+"([^"]*SXid \(PCI:[^"]*)"', text):
        if raw in seen:
            continue
        seen.add(raw)
        code = re.search(r"\): (\d+),", raw)
        known = code is not None and re.search(rf"^\t{code[1]}: \{{\n(.*?)^\t\}},", sxids, re.S | re.M)
        reboot = bool(known and "RepairActionTypeRebootSystem" in known[1])
        out.append(
            case(
                f"gpud-sxid-{len(seen)}",
                "gpud",
                GPUD_URL.format(commit=commit, path=path, line=line_of(text, raw)),
                judges="node",
                peer_label="hardware" if reboot else "non-hardware",
                kernel_log=raw,
                why="gpud's SXid catalogue: " + ("reboot the system" if reboot else "no repair action / unknown SXid"),
            )
        )
    return out


# (test line marker, findings, DCGM's result, why): NVML-shaped readings of what each test injects.
DCGM_CASES = [
    ("dcgm_errors.DCGM_FR_PCI_REPLAY_RATE)", [{"kind": "pcie_replay", "gpu": 0, "value": 100}], "WARN", "PCIe replay rate"),
    ("DCGM_FR_VOLATILE_DBE_DETECTED)\n\n    # Give it the same failure 45", [{"kind": "ecc_uncorrected", "gpu": 0, "value": 1}], "FAIL", "volatile DBE"),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, 2, -45)", [{"kind": "ecc_uncorrected", "gpu": 0, "value": 2}], "FAIL", "volatile DBE, 2"),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, 0, -40)", [{"kind": "ecc_uncorrected", "gpu": 0, "value": 0}], "PASS", "DBE count back to 0"),
    ("DCGM_FR_PENDING_PAGE_RETIREMENTS), \\", [{"kind": "retired_pages_pending", "gpu": 0}], "WARN", "pending page retirement"),
    (
        "DCGM_FR_NVLINK_ERROR_THRESHOLD",
        [{"kind": "nvlink_errors", "gpu": 0, "value": 100, "detail": "NVLink CRC flit errors"}],
        "WARN",
        "NVLink CRC errors under the critical threshold",
    ),
    ("def test_health_check_nvlink_link_down_gpu_standalone", [{"kind": "nvlink_down", "gpu": 0, "value": 0}], "FAIL", "NVLink down"),
    ("def test_health_check_nvlink_one_link_down_standalone", [{"kind": "nvlink_down", "gpu": 0, "value": 1}], "FAIL", "one NVLink down"),
    ("def test_health_check_nvlink_all_links_up_standalone", [], "PASS", "all links up"),
    (
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, 4, 100)",
        [{"kind": "ecc_uncorrected", "gpu": 0, "value": 4}, {"kind": "pcie_replay", "gpu": 0, "value": 100}],
        "FAIL",
        "DBE and PCIe replays together",
    ),
    ("dcgm_errors.DCGM_FR_UNCONTAINED_ERROR)", [{"kind": "xid", "gpu": 0, "xid": 95}], "FAIL", "Xid 95 uncontained error"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILED,", [{"kind": "remap_failure", "gpu": 0}], "FAIL", "row remap failed"),
    ("def test_dcgm_health_check_xid64_row_remap_failure", [{"kind": "xid", "gpu": 0, "xid": 64}], "FAIL", "Xid 64 row remap failure"),
    ("contained_error_xid = 94", [{"kind": "xid", "gpu": 0, "xid": 94}], "WARN", "Xid 94 contained error: no isolation"),
    ('"Failed to inject XID 93"', [{"kind": "xid", "gpu": 0, "xid": 93}], "WARN", "Xid 93 InfoROM (WARN on Volta, PASS otherwise)"),
]


def dcgm_cases(repo: str) -> list[dict]:
    path = "testing/python3/tests/test_health.py"
    commit, text = show(repo, path)
    out = []
    for number, (marker, findings, result, why) in enumerate(DCGM_CASES):
        assert marker in text, marker
        out.append(
            case(
                f"dcgm-{number}-{why.split()[0].lower()}",
                "DCGM",
                DCGM_URL.format(commit=commit, path=path, line=line_of(text, marker)),
                judges="node",
                peer_label="hardware" if result == "FAIL" else "non-hardware",
                findings=findings,
                why=f"DCGM health watch: {why} -> {result}",
            )
        )
    return out


def k8s_cases(repo: str) -> list[dict]:
    path = "internal/rm/health.go"
    commit, text = show(repo, path)
    block = text[text.index("ignoredXids := []uint64{") :]
    block = block[: block.index("}")]
    out = []
    for code, name in re.findall(r"(\d+),\s*// (.*)", block):
        override = "catalogue RESET_GPU: a context-switch timeout needs a GPU reset" if code == "109" else ""
        out.append(
            case(
                f"k8s-device-plugin-xid{code}",
                "k8s-device-plugin",
                K8S_URL.format(commit=commit, path=path, line=line_of(text, f"{code},")),
                judges="node",
                peer_label="non-hardware",
                findings=[{"kind": "xid", "gpu": 0, "xid": int(code), "detail": name}],
                override=override,
                why=f"skipped as an application error ({name}): the GPU stays healthy",
            )
        )
    for code in (48, 79):  # every other critical Xid event marks the device unhealthy
        out.append(
            case(
                f"k8s-device-plugin-xid{code}",
                "k8s-device-plugin",
                K8S_URL.format(commit=commit, path=path, line=line_of(text, "marking device as unhealthy")),
                judges="node",
                peer_label="hardware",
                findings=[{"kind": "xid", "gpu": 0, "xid": code}],
                why="an Xid critical error not skipped marks the device unhealthy",
            )
        )
    return out


HARDWARE_CLASSES = {"gpu_hardware_fault", "gpu_device_loss"}


def nvrx_cases(repo: str) -> list[dict]:
    path = "tests/attribution/unit/test_restart_agent.py"
    commit, text = show(repo, path)
    tree = ast.parse(text)
    out = []
    for fn in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]:
        env: dict = {}
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                value = _string(node.value, env)
                if value is not None:
                    env[node.targets[0].id] = value
        logs = [
            v
            for n in ast.walk(fn)
            if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and n.func.attr == "write_text"
            and n.args
            and isinstance(v := _string(n.args[0], env), str)
        ]
        classes = {
            c.comparators[0].value
            for c in ast.walk(fn)
            if isinstance(c, ast.Compare)
            and isinstance(c.left, ast.Attribute)
            and c.left.attr == "failure_class"
            and isinstance(c.comparators[0], ast.Constant)
            and isinstance(c.left.value, ast.Attribute)
            and c.left.value.attr == "deterministic_primary_candidate"
        }
        if not classes and "failure_line" in env and '"failure_class": "gpu_device_loss"' in ast.get_source_segment(text, fn):
            classes = {"gpu_device_loss"}
        if len(logs) == 1 and len(classes) == 1:
            cls = classes.pop()
            out.append(
                case(
                    f"nvrx-{fn.name.removeprefix('test_')[:60]}",
                    "NVRx",
                    NVRX_URL.format(commit=commit, path=path, line=fn.lineno),
                    judges="run",
                    peer_label="hardware" if cls in HARDWARE_CLASSES else "non-hardware",
                    log=logs[0],
                    why=f"NVRx restart agent: {cls}",
                )
            )
    return out


def _string(node, env):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return env.get(node.id)
    if isinstance(node, ast.JoinedStr):
        parts = [v.value if isinstance(v, ast.Constant) else _string(v.value, env) for v in node.values]
        return "".join(parts) if all(isinstance(p, str) for p in parts) else None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        a, b = _string(node.left, env), _string(node.right, env)
        return a + b if isinstance(a, str) and isinstance(b, str) else None
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "join"
        and isinstance(node.func.value, ast.Constant)
        and node.args
        and isinstance(node.args[0], (ast.List, ast.Tuple))
    ):
        parts = [_string(e, env) for e in node.args[0].elts]
        return node.func.value.value.join(parts) if all(isinstance(p, str) for p in parts) else None
    return None


if __name__ == "__main__":
    gpud, dcgm, nvrx, k8s = sys.argv[1:5]
    cases = gpud_cases(gpud) + dcgm_cases(dcgm) + k8s_cases(k8s) + nvrx_cases(nvrx)
    schema = (
        "id; peer; source (the peer's test file at a fixed commit and line); judges: node (scored against "
        "failover.classify.node_fault: does the product take a GPU or node out of placement) or run (against "
        "classify_failure: fail over or not); kernel_log / log / findings: the case as the peer's test states it; "
        "peer_label; expected (the peer's label, or NVIDIA's catalogue where override says why); why"
    )
    json.dump({"schema": schema, "cases": cases}, sys.stdout, indent=1)
    sys.stdout.write("\n")
