"""A stand-in for nvidia-ml-py's ``pynvml`` module, so the NVML backend runs without a GPU.

It implements the functions, constants and error classes of the real module that
``failover.nvml.NvmlProbe`` calls, with the real names, parameters and values
(``test_fake_pynvml.py`` checks them against the installed ``pynvml``), over a scripted machine:
``driver`` holds the GPUs' state, and tests change it between checks (an Xid event mid-run, an
ECC count rising, a GPU lost, an NVLink going down, a call that hangs).

Behaviour follows NVML's documentation: calls before ``nvmlInit`` fail with UNINITIALIZED; an
Xid event reaches only the event sets registered for that GPU when it happens; ``nvmlEventSetWait``
raises TIMEOUT when nothing is pending and GPU_IS_LOST once a registered GPU is lost; a lost GPU
answers every call with GPU_IS_LOST; an inactive NVLink reads ``NVML_FEATURE_DISABLED``.
"""

from __future__ import annotations

import string
import sys
import threading
from dataclasses import dataclass, field
from types import SimpleNamespace

# --- constants (values as in nvidia-ml-py's pynvml) ---------------------------------------------
NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_UNKNOWN = 999

NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
NVML_NVLINK_MAX_LINKS = 36
NVML_NVLINK_ERROR_DL_REPLAY = 0
NVML_NVLINK_ERROR_DL_RECOVERY = 1
NVML_NVLINK_ERROR_DL_CRC_FLIT = 2
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3
NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY = 161
NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY = 162
NVML_FI_DEV_NVLINK_ERROR_DL_CRC = 163
NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230
nvmlClocksEventReasonHwSlowdown = 0x0000000000000008
nvmlClocksEventReasonHwThermalSlowdown = 0x0000000000000040
nvmlEventTypeXidCriticalError = 0x0000000000000008


# --- errors: one NVMLError subclass per NVML_ERROR_* code, named as pynvml names them -----------
class NVMLError(Exception):
    _valClassMapping: dict = {}

    def __new__(typ, value):
        if typ == NVMLError:
            typ = NVMLError._valClassMapping.get(value, typ)
        obj = Exception.__new__(typ)
        obj.value = value
        return obj

    def __str__(self):
        return {
            NVML_ERROR_UNINITIALIZED: "Uninitialized",
            NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
            NVML_ERROR_NOT_SUPPORTED: "Not Supported",
            NVML_ERROR_TIMEOUT: "Timeout",
            NVML_ERROR_GPU_IS_LOST: "GPU is lost",
            NVML_ERROR_RESET_REQUIRED: "GPU requires restart",
        }.get(self.value, "Unknown Error")

    def __eq__(self, other):
        return self.value == other.value

    __hash__ = Exception.__hash__


def _error_classes() -> None:
    module = sys.modules[__name__]
    for name in [n for n in dir(module) if n.startswith("NVML_ERROR_")]:
        class_name = "NVMLError_" + string.capwords(name.replace("NVML_ERROR_", ""), "_").replace("_", "")
        value = getattr(module, name)

        def new(typ, *args, _value=value):
            return NVMLError.__new__(typ, _value)

        cls = type(class_name, (NVMLError,), {"__new__": new})
        cls.__module__ = __name__
        setattr(module, class_name, cls)
        NVMLError._valClassMapping[value] = cls


_error_classes()


# --- the scripted machine ------------------------------------------------------------------------
@dataclass
class FakeGpu:
    index: int
    bus: str
    lost: bool = False
    reset_required: bool = False
    ecc_uncorrected: int = 0
    pages_pending: bool = False
    remapped_rows: tuple = (0, 0, False, False)  # corrected, uncorrected, pending, failure
    pcie_replays: int = 0
    pcie_width: int = 16
    pcie_max_width: int = 16
    clock_reasons: int = 0
    links: list = field(default_factory=lambda: [NVML_FEATURE_ENABLED] * 4)
    link_errors: dict = field(default_factory=dict)  # (link, NVML_NVLINK_ERROR_DL_*) → count
    legacy_link_counters: bool = True  # False: nvmlDeviceGetNvLinkErrorCounter is NOT_SUPPORTED
    recovery_action: int = 0
    util: int = 0  # percent
    mem_used: int = 0  # bytes
    mem_total: int = 80 * 2**30
    power_mw: int = 60_000


class Driver:
    """The machine's GPUs and the NVML library's state; tests script it."""

    def __init__(self, gpus: int = 2) -> None:
        self.gpus = [FakeGpu(i, f"00000000:{0x18 + i * 0x10:02X}:00.0") for i in range(gpus)]
        self.initialised = 0  # nvmlInit calls not yet matched by nvmlShutdown
        self.inits = 0
        self.shutdowns = 0
        self.event_sets: dict[int, dict] = {}  # open sets: id → {"gpus": set, "queue": list}
        self.freed: list[int] = []
        self.calls: list[str] = []
        self.hung: dict[str, threading.Event] = {}
        self.lock = threading.Lock()

    # what happens to the machine
    def xid(self, gpu: int, code: int) -> None:
        with self.lock:
            for events in self.event_sets.values():
                if gpu in events["gpus"]:
                    events["queue"].append((gpu, code))

    def lose(self, gpu: int) -> None:
        self.gpus[gpu].lost = True
        self.xid(gpu, 79)

    def link_down(self, gpu: int, link: int) -> None:
        self.gpus[gpu].links[link] = NVML_FEATURE_DISABLED

    def hang(self, function: str) -> threading.Event:
        """Make every call of ``function`` block until the returned event is set."""
        self.hung[function] = threading.Event()
        return self.hung[function]

    def release(self) -> None:
        for gate in self.hung.values():
            gate.set()
        self.hung.clear()

    # what the functions share
    def enter(self, name: str) -> None:
        self.calls.append(name)
        gate = self.hung.get(name)
        if gate is not None:
            gate.wait()
        if not self.initialised:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)

    def gpu(self, handle) -> FakeGpu:
        if not isinstance(handle, _Handle):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[handle.index]
        if gpu.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        if gpu.reset_required:
            raise NVMLError(NVML_ERROR_RESET_REQUIRED)
        return gpu


driver = Driver()


def reset(gpus: int = 2) -> Driver:
    """A fresh machine (tests call this first)."""
    global driver
    driver.release()
    driver = Driver(gpus)
    return driver


@dataclass(frozen=True)
class _Handle:
    index: int


# --- the functions (same names and parameters as pynvml) -----------------------------------------
def nvmlInit():
    driver.calls.append("nvmlInit")
    gate = driver.hung.get("nvmlInit")
    if gate is not None:
        gate.wait()
    driver.initialised += 1
    driver.inits += 1


def nvmlShutdown():
    driver.enter("nvmlShutdown")
    driver.initialised -= 1
    driver.shutdowns += 1


def nvmlDeviceGetCount():
    driver.enter("nvmlDeviceGetCount")
    return len(driver.gpus)


def nvmlDeviceGetHandleByIndex(index):
    driver.enter("nvmlDeviceGetHandleByIndex")
    if not 0 <= index < len(driver.gpus):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    if driver.gpus[index].lost:
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    return _Handle(index)


def nvmlDeviceGetIndex(handle):
    driver.enter("nvmlDeviceGetIndex")
    return handle.index


def nvmlDeviceGetPciInfo(handle):
    driver.enter("nvmlDeviceGetPciInfo")
    return SimpleNamespace(busId=driver.gpu(handle).bus.encode())


def nvmlDeviceGetTotalEccErrors(handle, errorType, counterType):
    driver.enter("nvmlDeviceGetTotalEccErrors")
    gpu = driver.gpu(handle)
    if (errorType, counterType) != (NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC):
        return 0
    return gpu.ecc_uncorrected


def nvmlDeviceGetRetiredPagesPendingStatus(device):
    driver.enter("nvmlDeviceGetRetiredPagesPendingStatus")
    return int(driver.gpu(device).pages_pending)


def nvmlDeviceGetRemappedRows(device):
    driver.enter("nvmlDeviceGetRemappedRows")
    return driver.gpu(device).remapped_rows


def nvmlDeviceGetPcieReplayCounter(handle):
    driver.enter("nvmlDeviceGetPcieReplayCounter")
    return driver.gpu(handle).pcie_replays


def nvmlDeviceGetCurrPcieLinkWidth(handle):
    driver.enter("nvmlDeviceGetCurrPcieLinkWidth")
    return driver.gpu(handle).pcie_width


def nvmlDeviceGetMaxPcieLinkWidth(handle):
    driver.enter("nvmlDeviceGetMaxPcieLinkWidth")
    return driver.gpu(handle).pcie_max_width


def nvmlDeviceGetUtilizationRates(handle):
    driver.enter("nvmlDeviceGetUtilizationRates")
    gpu = driver.gpu(handle)
    return SimpleNamespace(gpu=gpu.util, memory=min(100, gpu.util))


def nvmlDeviceGetMemoryInfo(handle, version=None):
    driver.enter("nvmlDeviceGetMemoryInfo")
    gpu = driver.gpu(handle)
    return SimpleNamespace(total=gpu.mem_total, used=gpu.mem_used, free=gpu.mem_total - gpu.mem_used)


def nvmlDeviceGetPowerUsage(handle):
    driver.enter("nvmlDeviceGetPowerUsage")
    return driver.gpu(handle).power_mw


def nvmlDeviceGetCurrentClocksEventReasons(handle):
    driver.enter("nvmlDeviceGetCurrentClocksEventReasons")
    return driver.gpu(handle).clock_reasons


def nvmlDeviceGetNvLinkState(device, link):
    driver.enter("nvmlDeviceGetNvLinkState")
    gpu = driver.gpu(device)
    if not gpu.links:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    if not 0 <= link < len(gpu.links):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return gpu.links[link]


def nvmlDeviceGetNvLinkErrorCounter(device, link, counter):
    driver.enter("nvmlDeviceGetNvLinkErrorCounter")
    gpu = driver.gpu(device)
    if not gpu.legacy_link_counters:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    if not 0 <= link < len(gpu.links):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return gpu.link_errors.get((link, counter), 0)


_FIELD_COUNTER = {
    NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY: NVML_NVLINK_ERROR_DL_REPLAY,
    NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY: NVML_NVLINK_ERROR_DL_RECOVERY,
    NVML_FI_DEV_NVLINK_ERROR_DL_CRC: NVML_NVLINK_ERROR_DL_CRC_FLIT,
}


def nvmlDeviceGetFieldValues(handle, fieldIds):
    driver.enter("nvmlDeviceGetFieldValues")
    gpu = driver.gpu(handle)
    values = []
    for field_id in fieldIds:
        field_id, scope = field_id if isinstance(field_id, tuple) else (field_id, 0)
        ret, kind, value = NVML_ERROR_NOT_SUPPORTED, NVML_VALUE_TYPE_UNSIGNED_INT, 0
        if field_id == NVML_FI_DEV_GET_GPU_RECOVERY_ACTION:
            ret, value = NVML_SUCCESS, gpu.recovery_action
        elif field_id in _FIELD_COUNTER and scope < len(gpu.links):
            ret, kind, value = NVML_SUCCESS, NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, gpu.link_errors.get((scope, _FIELD_COUNTER[field_id]), 0)
        values.append(
            SimpleNamespace(
                fieldId=field_id,
                scopeId=scope,
                timestamp=0,
                latencyUsec=0,
                valueType=kind,
                nvmlReturn=ret,
                value=SimpleNamespace(uiVal=value, ullVal=value, ulVal=value, dVal=float(value), sllVal=value, siVal=value, usVal=value),
            )
        )
    return values


_next_set = [1]


def nvmlEventSetCreate():
    driver.enter("nvmlEventSetCreate")
    handle = _next_set[0]
    _next_set[0] += 1
    driver.event_sets[handle] = {"gpus": set(), "queue": []}
    return handle


def nvmlDeviceRegisterEvents(handle, eventTypes, eventSet):
    driver.enter("nvmlDeviceRegisterEvents")
    gpu = driver.gpu(handle)
    if eventSet not in driver.event_sets:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    if eventTypes & nvmlEventTypeXidCriticalError:
        driver.event_sets[eventSet]["gpus"].add(gpu.index)


def nvmlEventSetWait(eventSet, timeoutms):
    driver.enter("nvmlEventSetWait")
    events = driver.event_sets.get(eventSet)
    if events is None:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    with driver.lock:
        if events["queue"]:
            gpu, code = events["queue"].pop(0)
            return SimpleNamespace(device=_Handle(gpu), eventType=nvmlEventTypeXidCriticalError, eventData=code, gpuInstanceId=0, computeInstanceId=0)
    if any(driver.gpus[g].lost for g in events["gpus"]):
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    raise NVMLError(NVML_ERROR_TIMEOUT)


def nvmlEventSetFree(eventSet):
    driver.enter("nvmlEventSetFree")
    if driver.event_sets.pop(eventSet, None) is None:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    driver.freed.append(eventSet)
