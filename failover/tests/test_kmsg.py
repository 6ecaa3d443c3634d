"""The kernel-log reader: /dev/kmsg records (``prio,seq,usec,flags;message``) read non-blocking
from a cursor, every line a classifier table knows kept, an old line never returned twice, and an
unreadable log said, not silently empty. The kernel's side is a file or a FIFO the test writes."""

from __future__ import annotations

import os

import pytest

from failover.kmsg import KernelLogReader

RECORDS = [
    "6,100,1000000,-;usb 1-1: new high-speed USB device number 2",
    "3,101,2000000,-;NVRM: Xid (PCI:0000:18:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
    " SUBSYSTEM=pci",
    " DEVICE=+pci:0000:18:00.0",
    "3,102,2100000,-;NVRM: GPU 0000:18:00.0: GPU has fallen off the bus.",
    "3,103,2200000,-;pcieport 0000:00:01.0: AER: Uncorrected (Fatal) error received: 0000:18:00.0",
    "6,104,2300000,-;mlx5_core 0000:5e:00.0 mlx5_0: Link down",
    "2,105,2400000,-;CPU0: Core temperature above threshold, cpu clock throttled",
    "0,106,2500000,-;thermal thermal_zone0: critical temperature reached (105 C), shutting down",
    "3,107,2600000,-;python invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), order=0, oom_score_adj=0",
    "3,108,2700000,-;Out of memory: Killed process 4321 (python) total-vm:123456kB, anon-rss:654321kB",
    "4,109,2800000,-;NVRM: GPU at PCI:0000:18:00: GPU-1234 Timeout waiting for RPC from GSP!",
]
KEPT = [r.split(";", 1)[1] for r in RECORDS if r[0] != " " and ";" in r]
KEPT = [t for t in KEPT if not t.startswith(("usb", "CPU0"))]


def write(path, records, mode="a"):
    with open(path, mode) as f:
        f.write("".join(r + "\n" for r in records))


def test_every_known_line_is_kept_once_and_the_cursor_skips_old_ones(tmp_path):
    kmsg = tmp_path / "kmsg"
    write(kmsg, RECORDS, "w")
    reader = KernelLogReader(str(kmsg), fallbacks=False, booted=1_000.0)

    first = reader.read()
    assert [line.text for line in first] == KEPT
    assert [line.seq for line in first][:2] == [101, 102] and reader.seq == 109
    assert first[0].at == pytest.approx(1_002.0) and first[0].source == "kmsg" and reader.problem == ""
    assert reader.read() == []  # nothing new

    # The ring is read again from the start (a reopened /dev/kmsg): old records are behind the cursor.
    reader.close()
    write(kmsg, [RECORDS[1], "3,110,3000000,-;NVRM: Xid (PCI:0000:28:00): 48, pid=1, name=python, DBE (Double Bit Error) ECC Error"])
    again = reader.read()
    assert [line.seq for line in again] == [110]


def test_a_fifo_fed_while_the_reader_waits(tmp_path):
    fifo = tmp_path / "kmsg"
    os.mkfifo(fifo)
    reader = KernelLogReader(str(fifo), fallbacks=False)
    assert reader.read() == []  # opened non-blocking, nothing written yet
    writer = os.open(fifo, os.O_WRONLY)
    try:
        os.write(writer, (RECORDS[0] + "\n" + RECORDS[1] + "\n3,102,2100000,-;NVRM: GPU 0000:18:00.0: GPU has fal").encode())
        assert [line.seq for line in reader.read()] == [101]  # the half-written record waits
        os.write(writer, b"len off the bus.\n")
        assert [line.text for line in reader.read()] == ["NVRM: GPU 0000:18:00.0: GPU has fallen off the bus."]
        assert reader.read() == []
    finally:
        os.close(writer)
        reader.close()


@pytest.mark.slow  # the fallbacks run this machine's journalctl and dmesg
def test_an_unreadable_kernel_log_is_said_not_silently_empty(tmp_path):
    reader = KernelLogReader(str(tmp_path / "missing"), fallbacks=False)
    assert reader.read() == []
    assert reader.problem.startswith("kernel log unreadable") and "No such file" in reader.problem

    with_fallbacks = KernelLogReader(str(tmp_path / "missing"))
    with_fallbacks.read()
    # journalctl or dmesg may work on this machine; either way the node's health says how it was read.
    assert with_fallbacks.problem and str(tmp_path / "missing") in with_fallbacks.problem
