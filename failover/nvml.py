"""The NVML backend of the health probes: one long-lived probe per node, for the agent's lifetime.

``NvmlProbe`` initialises NVML once (``nvmlShutdown`` on ``close``), registers its Xid event set
when it is made (so an Xid that arrives before the first check, or between checks, is seen) and
frees it on ``close``. Every NVML call runs on the probe's own worker thread under a watchdog
(``NVML_CALL_TIMEOUT``): a driver call that hangs gives a ``driver_hung`` finding within the
timeout instead of blocking the agent, and later calls fail fast until the hung one returns.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable

from failover.evidence import Finding, FindingKind, HealthReport
from failover.xids import bus_id

logger = logging.getLogger(__name__)

NVML_CALL_TIMEOUT = 5.0  # seconds; well under the agent's heartbeat period
# Field-value equivalents of the legacy NVLink error counters, read per link (scopeId = link) where
# nvmlDeviceGetNvLinkErrorCounter is NOT_SUPPORTED (newer parts).
# Hardware slowdown is judged over a window, not on one reading: a GPU counts as slowed down when
# at least HW_SLOWDOWN_MIN_READINGS of its readings within HW_SLOWDOWN_WINDOW seconds showed it
# (a brief power-brake assertion is normal; DCGM's alert rules likewise require it to persist).
HW_SLOWDOWN_WINDOW = 60.0
HW_SLOWDOWN_MIN_READINGS = 3
NVLINK_COUNTER_FIELDS = ("NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY", "NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY", "NVML_FI_DEV_NVLINK_ERROR_DL_CRC")


class DriverHung(Exception):
    """An NVML call did not return within the watchdog's timeout (or one still has not)."""


class _Call:
    def __init__(self, fn: Callable, args: tuple) -> None:
        self.fn, self.args = fn, args
        self.done = threading.Event()
        self.result = None
        self.error: BaseException | None = None

    @property
    def name(self) -> str:
        return getattr(self.fn, "__name__", repr(self.fn))


class Watchdog:
    """Runs calls one at a time on a daemon worker thread, waiting at most ``timeout`` for each.

    A call that outlasts the timeout raises :class:`DriverHung` in the caller; while it is still
    stuck, every later call raises at once (NVML serialises on the driver, so they would queue
    behind it). Once it returns, calls go through again.
    """

    def __init__(self, timeout: float = NVML_CALL_TIMEOUT, name: str = "nvml") -> None:
        self.timeout = timeout
        self.name = name
        self.calls: queue.SimpleQueue = queue.SimpleQueue()
        self.stuck: _Call | None = None
        self.thread: threading.Thread | None = None

    def __call__(self, fn: Callable, *args):
        stuck = self.stuck
        if stuck is not None and not stuck.done.is_set():
            raise DriverHung(f"NVML call {stuck.name} still hung")
        if self.thread is None or not self.thread.is_alive():
            self.thread = threading.Thread(target=self.work, name=f"{self.name}-watchdog", daemon=True)
            self.thread.start()
        call = _Call(fn, args)
        self.calls.put(call)
        if not call.done.wait(self.timeout):
            self.stuck = call
            raise DriverHung(f"NVML call {call.name} did not return within {self.timeout:g}s")
        if call.error is not None:
            raise call.error
        return call.result

    def work(self) -> None:
        while True:
            call = self.calls.get()
            if call is None:
                return
            try:
                call.result = call.fn(*call.args)
            except BaseException as exc:  # handed to the caller
                call.error = exc
            finally:
                call.done.set()

    def stop(self) -> None:
        if self.thread is not None:
            self.calls.put(None)


class NvmlProbe:
    """Reads the machine's GPUs through NVML. Made once per node and kept (the agent's plug-in
    and the failover policy share it); ``close()`` releases NVML.

    Covers: Xid critical-error events (and the event wait's own errors: GPU lost), volatile
    uncorrected ECC counts, retired pages pending, row remapping (pending / failure), GPU lost and
    reset required, PCIe replay counter and link width, NVLink state (a link down) and error
    counters (legacy counters, or their field values where those are NOT_SUPPORTED),
    hardware-slowdown clock reasons, the GPU count against the expected count, the driver's
    recovery action, and NVML calls that hang.
    """

    def __init__(self, node_name: str, *, expected_gpus: int, nvml=None, timeout: float = NVML_CALL_TIMEOUT) -> None:
        if nvml is None:
            # Looked up when a probe is made, not at import: a test puts the simulated driver
            # (failover.tests.fake_pynvml, the same signatures) in sys.modules first.
            import pynvml

            nvml = pynvml
        self.nv = nvml
        self.node_name = node_name
        self.expected_gpus = expected_gpus
        self.call = Watchdog(timeout, name=f"nvml-{node_name}")
        self.lock = threading.Lock()  # one check at a time (the agent's round, a judge)
        self.pcie_replays: dict[int, int] = {}
        self.nvlink_errors: dict[tuple[int, int], int] = {}
        self.pending: list[Finding] = []  # Xid events drained (by the monitor) but not yet reported by check()
        self.events_lock = threading.Lock()
        self.slowdowns: dict[int, deque] = {}  # GPU → times of readings that showed a hardware slowdown
        self.closed = False
        self.call(nvml.nvmlInit)
        self.events = None
        try:
            self.events = self.register_xid_events()
        except DriverHung:
            logger.warning("%s: NVML hung while registering Xid events; retried at the next check", node_name)

    # --- lifecycle ----------------------------------------------------------------------------
    def close(self) -> None:
        """Free the event set and shut NVML down (each call under the watchdog)."""
        if self.closed:
            return
        self.closed = True
        nv = self.nv
        try:
            if self.events is not None:
                self.call(nv.nvmlEventSetFree, self.events)
            self.call(nv.nvmlShutdown)
        except (nv.NVMLError, DriverHung) as exc:
            logger.warning("%s: closing NVML: %s", self.node_name, exc)
        finally:
            self.events = None
            self.call.stop()

    def register_xid_events(self):
        nv = self.nv
        events = self.call(nv.nvmlEventSetCreate)
        for index in range(self.call(nv.nvmlDeviceGetCount)):
            try:
                handle = self.call(nv.nvmlDeviceGetHandleByIndex, index)
                self.call(nv.nvmlDeviceRegisterEvents, handle, nv.nvmlEventTypeXidCriticalError, events)
            except nv.NVMLError as exc:  # not supported on this GPU, or the GPU is gone (checks report it)
                logger.warning("%s: no Xid events from GPU %s: %s", self.node_name, index, exc)
        return events

    # --- the check ----------------------------------------------------------------------------
    def check(self) -> HealthReport:
        with self.lock:
            findings: list[Finding] = []
            try:
                self.read_all(findings)
            except DriverHung as exc:
                findings.append(Finding(kind=FindingKind.DRIVER_ERROR, detail=f"driver call hung: {exc}"))
            return HealthReport(node=self.node_name, findings=tuple(findings), source="nvml")

    def read_all(self, findings: list[Finding]) -> None:
        self.drain()
        with self.events_lock:  # first: they are kept even if a later call hangs
            findings.extend(self.pending)
            self.pending.clear()
        nv = self.nv
        count = self.call(nv.nvmlDeviceGetCount)
        if count < self.expected_gpus:
            findings.append(Finding(kind=FindingKind.GPU_COUNT, value=count, expected=self.expected_gpus, detail="fewer GPUs than expected"))
        for index in range(count):
            findings.extend(self.check_gpu(index))

    def check_gpu(self, index: int) -> list[Finding]:
        nv = self.nv
        out: list[Finding] = []
        try:
            handle = self.call(nv.nvmlDeviceGetHandleByIndex, index)
        except nv.NVMLError as exc:
            found = self.error_finding(exc, index)
            return [found] if found is not None else []

        def read(fn, *args):
            try:
                return self.call(fn, handle, *args)
            except nv.NVMLError_NotSupported:
                return None
            except nv.NVMLError as exc:
                finding = self.error_finding(exc, index)
                if finding is not None and finding not in out:
                    out.append(finding)
                return None

        ecc = read(nv.nvmlDeviceGetTotalEccErrors, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC)
        if ecc:
            out.append(Finding(kind=FindingKind.ECC_UNCORRECTED, gpu=index, value=int(ecc), detail="volatile uncorrected ECC errors"))
        if read(nv.nvmlDeviceGetRetiredPagesPendingStatus):
            out.append(Finding(kind=FindingKind.RETIRED_PAGES_PENDING, gpu=index, detail="retired pages pending a reset"))
        remap = read(nv.nvmlDeviceGetRemappedRows)
        if remap:
            _corr, _unc, is_pending, failure = remap
            if failure:
                out.append(Finding(kind=FindingKind.REMAP_FAILURE, gpu=index, detail="row remapping failed"))
            elif is_pending:
                out.append(Finding(kind=FindingKind.REMAP_PENDING, gpu=index, detail="row remapping pending"))
        replay = read(nv.nvmlDeviceGetPcieReplayCounter)
        if replay is not None:
            before = self.pcie_replays.get(index, replay)
            self.pcie_replays[index] = replay
            if replay > before:
                out.append(Finding(kind=FindingKind.PCIE_REPLAY, gpu=index, value=int(replay - before), detail="PCIe replays"))
        width, max_width = read(nv.nvmlDeviceGetCurrPcieLinkWidth), read(nv.nvmlDeviceGetMaxPcieLinkWidth)
        if width and max_width and width < max_width:
            out.append(Finding(kind=FindingKind.PCIE_LINK_DEGRADED, gpu=index, value=int(width), expected=int(max_width), detail="PCIe link width degraded"))
        reasons = read(nv.nvmlDeviceGetCurrentClocksEventReasons) if hasattr(nv, "nvmlDeviceGetCurrentClocksEventReasons") else None
        hw_slowdown = getattr(nv, "nvmlClocksEventReasonHwSlowdown", 0x8) | getattr(nv, "nvmlClocksEventReasonHwThermalSlowdown", 0x40)
        seen = self.slowdowns.setdefault(index, deque())
        now = time.monotonic()
        if reasons and reasons & hw_slowdown:
            seen.append(now)
        while seen and seen[0] < now - HW_SLOWDOWN_WINDOW:
            seen.popleft()
        if reasons and reasons & hw_slowdown and len(seen) >= HW_SLOWDOWN_MIN_READINGS:
            detail = f"hardware slowdown clock reason in {len(seen)} readings within {HW_SLOWDOWN_WINDOW:g}s"
            out.append(Finding(kind=FindingKind.THERMAL, gpu=index, value=int(reasons), detail=detail))
        out.extend(self.check_nvlinks(handle, index, read))
        if hasattr(nv, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION"):
            values = read(nv.nvmlDeviceGetFieldValues, [nv.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])
            if values and values[0].nvmlReturn == nv.NVML_SUCCESS and int(values[0].value.uiVal):
                action = int(values[0].value.uiVal)
                out.append(Finding(kind=FindingKind.RECOVERY_ACTION, gpu=index, value=action, detail=f"driver recovery action {action}"))
        return out

    def check_nvlinks(self, handle, index: int, read) -> list[Finding]:
        """Each link's state (``NVML_FEATURE_DISABLED``: down, reported) and its error counters
        against the previous reading. A counter NOT_SUPPORTED by the legacy call is read as a
        field value; neither stops the other links or the other checks."""
        nv = self.nv
        out: list[Finding] = []
        for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
            try:
                state = self.call(nv.nvmlDeviceGetNvLinkState, handle, link)
            except nv.NVMLError_NotSupported:
                break  # no NVLink on this GPU
            except nv.NVMLError_InvalidArgument:
                break  # past the GPU's last link
            except nv.NVMLError as exc:
                finding = self.error_finding(exc, index)
                if finding is not None:
                    out.append(finding)
                break
            if state == nv.NVML_FEATURE_DISABLED:
                out.append(Finding(kind=FindingKind.NVLINK_DOWN, gpu=index, value=link, detail=f"NVLink link {link} inactive"))
                continue
            errors = self.nvlink_error_total(handle, link, read)
            if errors is None:
                continue
            before = self.nvlink_errors.get((index, link), errors)
            self.nvlink_errors[(index, link)] = errors
            if errors > before:
                out.append(Finding(kind=FindingKind.NVLINK_ERRORS, gpu=index, value=int(errors - before), detail=f"NVLink link {link} errors"))
        return out

    def nvlink_error_total(self, handle, link: int, read) -> int | None:
        nv = self.nv
        counters = [
            read(nv.nvmlDeviceGetNvLinkErrorCounter, link, c)
            for c in (nv.NVML_NVLINK_ERROR_DL_REPLAY, nv.NVML_NVLINK_ERROR_DL_RECOVERY, nv.NVML_NVLINK_ERROR_DL_CRC_FLIT)
        ]
        if any(c is not None for c in counters):
            return sum(int(c or 0) for c in counters)
        fields = [(getattr(nv, name), link) for name in NVLINK_COUNTER_FIELDS if hasattr(nv, name)]
        values = read(nv.nvmlDeviceGetFieldValues, fields) if fields else None
        read_ok = [v for v in values or () if v.nvmlReturn == nv.NVML_SUCCESS]
        if not read_ok:
            return None
        return sum(int(v.value.ullVal) for v in read_ok)

    def error_finding(self, exc, index: int | None) -> Finding | None:
        nv = self.nv
        if isinstance(exc, nv.NVMLError_GpuIsLost):
            return Finding(kind=FindingKind.GPU_LOST, gpu=index, detail="NVML: GPU is lost")
        if isinstance(exc, getattr(nv, "NVMLError_ResetRequired", ())):
            return Finding(kind=FindingKind.RESET_REQUIRED, gpu=index, detail="NVML: GPU requires a reset")
        logger.warning("%s: NVML error on GPU %s: %s", self.node_name, index, exc)
        return None

    def drain_events(self) -> list[Finding]:
        """Drain the Xid event set now (the health monitor's thread calls this every fraction of a
        second); the events are returned and also kept for the next ``check()``. Never raises:
        a hung call is a ``driver_error`` finding (returned, not kept: ``check()`` sees it itself)."""
        try:
            return self.drain()
        except DriverHung as exc:
            return [Finding(kind=FindingKind.DRIVER_ERROR, detail=f"driver call hung: {exc}")]
        except self.nv.NVMLError as exc:
            return [self.error_finding(exc, None) or Finding(kind=FindingKind.DRIVER_ERROR, detail=f"NVML: {exc}")]

    def drain(self) -> list[Finding]:
        with self.events_lock:
            if self.closed:
                return []
            if self.events is None:
                self.events = self.register_xid_events()
            found = self.xid_events()
            self.pending.extend(f for f in found if f not in self.pending)
            return found

    def xid_events(self) -> list[Finding]:
        """Drain the Xid critical-error events that arrived since the last check, without blocking.
        A wait error other than TIMEOUT (none pending) is a finding: GPU_IS_LOST is not hidden."""
        nv = self.nv
        out: list[Finding] = []
        if not self.events:
            return out
        while True:
            try:
                data = self.call(nv.nvmlEventSetWait, self.events, 0)
            except nv.NVMLError_Timeout:
                break
            except nv.NVMLError as exc:
                finding = self.error_finding(exc, None)
                if finding is not None and finding.kind == FindingKind.GPU_LOST:
                    # The wait says one of the set's GPUs is lost, not which: ask each of them.
                    out.extend(Finding(kind=FindingKind.GPU_LOST, gpu=i, detail="NVML: GPU is lost") for i in self.lost_gpus())
                    if any(f.kind == FindingKind.GPU_LOST for f in out):
                        break
                out.append(finding or Finding(kind=FindingKind.DRIVER_ERROR, detail=f"NVML event wait failed: {exc}"))
                break
            gpu = None
            with contextlib.suppress(nv.NVMLError):
                gpu = int(self.call(nv.nvmlDeviceGetIndex, data.device))
            out.append(Finding(kind=FindingKind.XID, gpu=gpu, xid=int(data.eventData), detail="NVML Xid critical error event"))
        return out

    def lost_gpus(self) -> list[int]:
        """The GPUs that answer GPU_IS_LOST."""
        nv = self.nv
        lost = []
        for index in range(self.call(nv.nvmlDeviceGetCount)):
            try:
                self.call(nv.nvmlDeviceGetHandleByIndex, index)
            except nv.NVMLError_GpuIsLost:
                lost.append(index)
            except nv.NVMLError:
                pass
        return lost

    def gpu_by_pci(self) -> dict[str, int]:

        nv = self.nv
        found: dict[str, int] = {}
        try:
            for index in range(self.call(nv.nvmlDeviceGetCount)):
                try:
                    bus = self.call(nv.nvmlDeviceGetPciInfo, self.call(nv.nvmlDeviceGetHandleByIndex, index)).busId
                except nv.NVMLError:
                    continue
                found[bus_id(bus.decode() if isinstance(bus, bytes) else bus)] = index
        except (nv.NVMLError, DriverHung):
            logger.warning("could not read the PCI addresses of %s's GPUs", self.node_name)
        return found

    def usage(self, gpu_indices) -> dict[int, tuple[float, float, float]]:
        """Utilisation (%), memory in use (MiB) and power (W) of these GPUs, each call under the
        watchdog; a GPU that does not answer (lost, not supported, hung) is left out: usage is a
        chart's point, never evidence."""
        nv = self.nv
        out: dict[int, tuple[float, float, float]] = {}
        for index in gpu_indices:
            try:
                handle = self.call(nv.nvmlDeviceGetHandleByIndex, index)
                util = self.call(nv.nvmlDeviceGetUtilizationRates, handle).gpu
                used = self.call(nv.nvmlDeviceGetMemoryInfo, handle).used
                power = self.call(nv.nvmlDeviceGetPowerUsage, handle)  # milliwatts
            except (nv.NVMLError, DriverHung):
                continue
            out[index] = (float(util), used / 2**20, power / 1000)
        return out

    def kernel_log(self) -> str:
        """Kernel-log lines are read by the node's health monitor (``failover.kmsg``, with a
        cursor) and stored as health events; the probe itself reads none."""
        return ""
