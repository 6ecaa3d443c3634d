"""The run's own output, scanned for the classifier (stdlib only): Table 4, hardware signatures
(``LOG_HARDWARE_SIGNATURES``), and Table 5, internal errors most specific first
(``NON_HARDWARE_SIGNATURES``). ``failover.classify`` applies them; docs/failover.md lists them.

These read the run's own output, which may explain that run's own verdict only. The one kernel text
read here is the kernel's own OOM-killer records (picked by ``failover.xids.parse_kernel_line``), and
only for the host OOM kill (``KERNEL_OOM_SIGNATURE``): a process name they quote spells nothing else.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

_SOURCE_ECHO = re.compile(r'^\s*File "[^"]*", line \d+')
_EXCEPTION_LINE = re.compile(r"^(?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception): ")
_RANK_PREFIX = re.compile(r"^\s*(?:\[(?:rank|default)\d*\]:?\s*|\[\d+\]\s*|stderr:\s*)+")
_MAX_MATCHED = 300

# --- Table 4: hardware signatures in the run's own output ---------------------------------------
# (name, pattern, reason). On a Python exception line these count only when the line carries a
# runtime error prefix (RUNTIME_PREFIX): "RuntimeError: CUDA error: uncorrectable ECC error
# encountered" is hardware, a user's "ValueError: GPU has fallen off the bus?" is not.
LOG_HARDWARE_SIGNATURES: tuple[tuple[str, str, str], ...] = (
    ("ecc_uncorrectable", r"uncorrectable ECC error encountered|ECC_UNCORRECTABLE|cudaErrorECCUncorrectable", "uncorrectable ECC error encountered"),
    ("gpu_lost", r"\bGPU is lost\b|NVMLError_GPUIsLost|NVML_ERROR_GPU_IS_LOST", "GPU is lost"),
    ("fallen_off_bus", r"fallen off the bus", "GPU has fallen off the bus"),
    ("nvlink_uncorrectable", r"uncorrectable NVLink error|cudaErrorNvlinkUncorrectable|NVLINK_UNCORRECTABLE", "uncorrectable NVLink error"),
    ("ib_port_error", r"NET/IB\w* ?: Got async event ?: port error|IBV_EVENT_PORT_ERR", "InfiniBand port error (link down or flapping)"),
    # The driver's Xid line quoted in the run's output (NVRx attributes it to the infrastructure); a
    # log-only signature fails over this job only: the node is marked by its own kernel log alone.
    ("xid_in_log", r"\bNVRM: Xid\b", "the driver reported an Xid"),
    # nvidia-smi's own words when the driver cannot reach a GPU any more.
    ("device_handle_unknown", r"Unable to determine the device handle for (?:GPU|gpu)\S*.*Unknown Error", "nvidia-smi cannot reach the GPU (Unknown Error)"),
)
RUNTIME_PREFIX = re.compile(r"CUDA error|CUDA_ERROR_|cudaError|cuda runtime error|NVMLError|NVML_ERROR|NCCL")

# --- Table 5: internal (non-hardware) errors, most specific first --------------------------------
# (name, pattern, reason, ambiguous). reason None: the matched line itself is the reason (Python
# exceptions). Ambiguous ones become hardware when the node shows supporting evidence.
NON_HARDWARE_SIGNATURES: tuple[tuple[str, str, str | None, bool], ...] = (
    ("cuda_oom", r"CUDA out of memory|OutOfMemoryError|CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation", "CUDA out of memory", False),
    ("device_assert", r"device-side assert(?:ion)? triggered|Assertion `.*` failed", "device-side assert triggered", False),
    ("state_dict_mismatch", r"size mismatch for |Error\(s\) in loading state_dict", "shape mismatch loading a checkpoint (state_dict)", False),
    ("nan_loss", r"(?i)loss became infinite or nan|\bloss\b[\w\s]{0,20}(?:is|=|:)\s*nan\b|\bnan loss\b", "NaN / infinite loss", False),
    ("import_error", r"\b(?:ModuleNotFoundError|ImportError): .*", None, False),
    ("syntax_error", r"\b(?:SyntaxError|IndentationError|TabError): .*", None, False),
    # python's own words for a script path it cannot open, relative to the run's working directory:
    # a command pasted from the docs' local example (`python examples/spot_train.py`).
    (
        "script_not_in_work_dir",
        r"can't open file '/job/work/[^']*'",
        "the script is not in the run's working directory /job/work (where the command starts: it holds "
        "only what the job's runs wrote); give the script's absolute path: the default image's examples "
        "are in /opt/examples (python /opt/examples/spot_train.py), a project volume's files at its path",
        False,
    ),
    ("missing_file", r"\bFileNotFoundError: .*|No such file or directory", None, False),
    ("permission_denied", r"\bPermissionError: .*|Permission denied", None, False),
    ("bad_arguments", r"error: (?:unrecognized arguments|the following arguments are required|argument )", None, False),
    (
        "illegal_memory_access",
        r"illegal memory access was encountered|cudaErrorIllegalAddress|"
        r"CUDA_ERROR_ILLEGAL_ADDRESS",
        "illegal memory access",
        True,
    ),
    ("launch_failure", r"unspecified launch failure", "unspecified launch failure", True),
    # CUDA's "uncorrectable error contained" says first "Invalid access of peer GPU memory over nvlink":
    # a peer-access bug as often as a fault; hardware only with the node's own evidence.
    ("cuda_contained", r"CUDA_ERROR_CONTAINED|cudaErrorContained", "uncorrectable GPU error contained", True),
    (
        "nccl_timeout",
        r"Watchdog caught collective operation timeout|NCCL[^\n]*timed out|"
        r"collective operation timeout",
        "NCCL collective timeout",
        True,
    ),
    ("nccl_ib_completion", r"NET/IB\w* ?: Got completion from peer", "NCCL network (IB) completion error", True),
    (
        "host_oom_kill",
        r"Out of memory: Kill(?:ed)? process|invoked oom-killer|oom-kill:|"
        r"Signal 9 \(SIGKILL\)|exitcode\s*:\s*-9\b|killed by signal: Killed",
        "killed by SIGKILL (host OOM kill?)",
        False,
    ),
    # Launcher wrappers (torchrun's ChildFailedError, subprocess's CalledProcessError) only repeat
    # that a child failed; the child's own exception is the more specific reason.
    ("python_exception", r"^(?!.*(?:ChildFailedError|CalledProcessError))(?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception): .*", None, False),
)

KERNEL_OOM_SIGNATURE = "host_oom_kill"  # the one Table 5 row the kernel's own records may match


# --- scanning the run's own output -----------------------------------------------------------------


def _log_lines_to_scan(lines: Iterable[str]) -> list[str]:
    """The lines worth matching: traceback source echoes (the user's own code) are skipped."""
    scanned: list[str] = []
    previous_was_file_line = False
    for raw in lines:
        line = _RANK_PREFIX.sub("", raw.rstrip("\n")).strip()
        if previous_was_file_line:
            previous_was_file_line = False
            if not _SOURCE_ECHO.match(line) and not _EXCEPTION_LINE.match(line):
                continue
        if _SOURCE_ECHO.match(line):
            previous_was_file_line = True
        scanned.append(line)
    return scanned


def _first_log_hardware_signature(log_lines: Sequence[str]) -> tuple[str, str, str] | None:
    lines = _log_lines_to_scan(log_lines)
    for name, pattern, reason in LOG_HARDWARE_SIGNATURES:
        regex = re.compile(pattern)
        for line in lines:
            if not regex.search(line):
                continue
            if _EXCEPTION_LINE.match(line) and not RUNTIME_PREFIX.search(line) and not _runtime_says(regex, line):
                continue  # a user's exception quoting hardware words is not a runtime signature
            return name, reason, _trim(line)
    return None


def _runtime_says(regex: re.Pattern[str], line: str) -> bool:
    """A ``RuntimeError`` whose message *is* the hardware phrase (``RuntimeError: GPU has fallen off
    the bus``, as PyTorch raises it; NVRx attributes it to the infrastructure), not one that quotes it."""
    hit = regex.search(line[len("RuntimeError: ") :]) if line.startswith("RuntimeError: ") else None
    return hit is not None and hit.start() <= len("GPU has ")


def _most_specific_internal_error(log_lines: Sequence[str], oom_records: Sequence[str]) -> tuple[str, str, str, bool] | None:
    """The most specific internal error in the run's own output; ``oom_records``, the kernel's own
    OOM-killer records (``failover.classify`` picks them with ``failover.xids.parse_kernel_line``), count
    for the host OOM kill alone: the process name they quote never spells another signature."""
    lines = _log_lines_to_scan(log_lines)
    kernel = [line.strip() for line in oom_records]
    for name, pattern, reason, ambiguous in NON_HARDWARE_SIGNATURES:
        regex = re.compile(pattern)
        hits = [line for line in lines + (kernel if name == KERNEL_OOM_SIGNATURE else []) if regex.search(line)]
        if not hits:
            continue
        line = hits[-1]  # the last occurrence is closest to the failure
        if reason is None:
            match = regex.search(line)
            tail = line[match.start() :] if match else line
            reason = _trim(tail if _EXCEPTION_LINE.match(tail) else line, 200)
        return name, reason, _trim(line), ambiguous
    return None


def _trim(text: str, limit: int = _MAX_MATCHED) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"
