"""The NVML backend, run against the fake pynvml over scripted GPU timelines."""

from __future__ import annotations

import time

import pytest

from failover.classify import classify_failure
from failover.evidence import FindingKind
from failover.nvml import DriverHung, NvmlProbe, Watchdog
from failover.tests import fake_pynvml


@pytest.fixture
def nvml_driver_alone():
    """The fake driver with two GPUs, alone: handed to the probe, not installed as ``pynvml``, and
    no node in the database (the ``gpus`` fixture of the failover tests' conftest gives node-a)."""
    driver = fake_pynvml.reset(gpus=2)
    yield driver
    driver.release()


@pytest.fixture
def probe(nvml_driver_alone):
    made = NvmlProbe("gpu-node-1", expected_gpus=2, nvml=fake_pynvml, timeout=0.5)
    yield made
    made.close()


def kinds(report):
    return [(f.kind, f.gpu) for f in report.findings]


def test_nominal_gpus_give_no_findings(probe):
    assert probe.check().nominal
    assert probe.check().nominal


def test_nvml_is_initialised_once_and_shut_down_on_close(nvml_driver_alone):
    probe = NvmlProbe("n", expected_gpus=2, nvml=fake_pynvml)
    for _ in range(3):
        probe.check()
    assert nvml_driver_alone.inits == 1 and nvml_driver_alone.shutdowns == 0
    probe.close()
    probe.close()
    assert nvml_driver_alone.shutdowns == 1 and nvml_driver_alone.initialised == 0


def test_the_event_set_is_registered_at_construction_and_freed_on_close(nvml_driver_alone):
    probe = NvmlProbe("n", expected_gpus=2, nvml=fake_pynvml)
    assert list(nvml_driver_alone.event_sets) == [probe.events] and nvml_driver_alone.event_sets[probe.events]["gpus"] == {0, 1}
    events = probe.events
    probe.close()
    assert nvml_driver_alone.freed == [events] and not nvml_driver_alone.event_sets


def test_an_xid_before_the_first_check_is_seen(nvml_driver_alone, probe):
    nvml_driver_alone.xid(1, 48)  # the fault happens before anyone checks

    report = probe.check()

    assert [(f.kind, f.gpu, f.xid) for f in report.findings] == [(FindingKind.XID, 1, 48)]
    assert probe.check().nominal  # drained once, not repeated


def test_timeline_xid_mid_run_then_ecc_rise(nvml_driver_alone, probe):
    assert probe.check().nominal
    nvml_driver_alone.xid(0, 13)
    assert [(f.kind, f.xid) for f in probe.check().findings] == [(FindingKind.XID, 13)]
    nvml_driver_alone.gpus[0].ecc_uncorrected = 2
    report = probe.check()
    assert [(f.kind, f.gpu, f.value) for f in report.findings] == [(FindingKind.ECC_UNCORRECTED, 0, 2)]
    assert classify_failure(exit_code=1, findings=report.findings).hardware


def test_a_lost_gpu_is_reported_from_the_event_wait_and_the_readings(nvml_driver_alone, probe):
    probe.check()
    nvml_driver_alone.gpus[1].lost = True  # no Xid event: the wait itself answers GPU_IS_LOST

    # nvmlEventSetWait answers GPU_IS_LOST (not swallowed as a timeout); the probe asks each GPU which.
    assert [(f.kind, f.gpu) for f in probe.drain_events()] == [(FindingKind.GPU_LOST, 1)]
    found = kinds(probe.check())

    assert (FindingKind.GPU_LOST, 1) in found
    assert all(gpu != 0 for _, gpu in found)


def test_a_down_nvlink_is_reported(nvml_driver_alone, probe):
    nvml_driver_alone.link_down(0, 2)

    report = probe.check()

    assert [(f.kind, f.gpu, f.value) for f in report.findings] == [(FindingKind.NVLINK_DOWN, 0, 2)]
    assert "NVLink link 2 down" in classify_failure(exit_code=1, findings=report.findings).reason


def test_legacy_nvlink_counters_not_supported_fall_back_to_field_values(nvml_driver_alone, probe):
    for gpu in nvml_driver_alone.gpus:
        gpu.legacy_link_counters = False
    assert probe.check().nominal
    nvml_driver_alone.gpus[1].link_errors[(3, fake_pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT)] = 5
    nvml_driver_alone.gpus[1].ecc_uncorrected = 1
    nvml_driver_alone.link_down(0, 1)

    found = {(f.kind, f.gpu, f.value) for f in probe.check().findings}

    assert found == {(FindingKind.NVLINK_ERRORS, 1, 5), (FindingKind.ECC_UNCORRECTED, 1, 1), (FindingKind.NVLINK_DOWN, 0, 1)}


def test_a_gpu_without_nvlink_still_gets_its_other_checks(nvml_driver_alone, probe):
    nvml_driver_alone.gpus[0].links = []  # nvmlDeviceGetNvLinkState: NOT_SUPPORTED
    nvml_driver_alone.gpus[0].recovery_action = 1
    assert kinds(probe.check()) == [(FindingKind.RECOVERY_ACTION, 0)]


@pytest.mark.slow  # the watchdog's thread, its timeout waited out
def test_a_hung_call_gives_a_finding_while_it_is_still_hung(nvml_driver_alone, probe):
    """The check returns a finding while the driver call is still blocked (its gate never opened
    until the end), and later checks fail fast: the hung call is not made again. How long the
    watchdog waits is ``bench.failover``'s ``hung`` figure, not a test's."""
    probe.check()
    nvml_driver_alone.xid(0, 79)
    gate = nvml_driver_alone.hang("nvmlDeviceGetTotalEccErrors")

    report = probe.check()

    assert not gate.is_set()
    assert [f.kind for f in report.findings] == [FindingKind.XID, FindingKind.DRIVER_ERROR]
    assert "driver call hung" in report.findings[-1].detail
    calls = nvml_driver_alone.calls.count("nvmlDeviceGetTotalEccErrors")
    assert [f.kind for f in probe.check().findings] == [FindingKind.DRIVER_ERROR]  # fails fast
    assert nvml_driver_alone.calls.count("nvmlDeviceGetTotalEccErrors") == calls
    gate.set()
    assert probe.call.stuck.done.wait(10)  # the hung call has returned (not a guess at how soon)
    assert probe.check().nominal  # the call returned: checks go through again


@pytest.mark.slow  # the watchdog's thread, its timeout waited out
def test_a_hung_driver_does_not_make_the_node_unhealthy_alone(nvml_driver_alone, probe):
    nvml_driver_alone.hang("nvmlDeviceGetCount")
    report = probe.check()
    assert [f.kind for f in report.findings] == [FindingKind.DRIVER_ERROR]
    assert not classify_failure(exit_code=1, findings=report.findings).hardware


@pytest.mark.slow  # the watchdog's thread, its timeout waited out
def test_the_watchdog_passes_results_and_errors_through():
    watchdog = Watchdog(timeout=0.2)
    assert watchdog(lambda a, b: a + b, 2, 3) == 5
    with pytest.raises(ZeroDivisionError):
        watchdog(lambda: 1 / 0)
    with pytest.raises(DriverHung):
        watchdog(time.sleep, 1)
    watchdog.stop()


def test_usage_is_read_per_gpu_and_a_lost_gpu_is_left_out(nvml_driver_alone, probe):
    nvml_driver_alone.gpus[0].util, nvml_driver_alone.gpus[0].mem_used, nvml_driver_alone.gpus[0].power_mw = 87, 3 * 2**30, 312_500
    nvml_driver_alone.gpus[1].lost = True
    assert probe.usage([0, 1]) == {0: (87.0, 3072.0, 312.5)}


def test_the_agents_sampler_reads_real_gpus_through_the_health_checkers_probe(nvml_driver_alone, probe):
    """agent.sampling's reader for non-simulated nodes is the health checker's probe (no second
    nvmlInit): what the sampler charts for a job on a real node."""
    from agent import sampling
    from failover.services.health import HealthChecker, ProbeUsageReader
    from failover.tests.fake_agent import FakeAgent

    checker = HealthChecker(FakeAgent(node_names=["gpu-node-1"]))
    checker.probes["gpu-node-1"] = probe
    nvml_driver_alone.gpus[1].util, nvml_driver_alone.gpus[1].mem_used, nvml_driver_alone.gpus[1].power_mw = 40, 2**30, 150_000
    assert isinstance(sampling._real_reader, ProbeUsageReader)
    reading = sampling._real_reader.read("gpu-node-1", [1])[1]
    assert (reading.util, reading.mem_mb, reading.power_w) == (40.0, 1024, 150.0)
    assert sampling._real_reader.read("another-node", [0]) == {}
    assert fake_pynvml.driver.inits == 1
    checker.probes.clear()
    checker.monitor.stop()
