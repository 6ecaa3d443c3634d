"""The node's kernel log, read from where the last read stopped (standard library only).

``KernelLogReader.read()`` returns the lines written since the previous call that
``failover.xids.parse_kernel_line`` knows: NVRM Xid and NVSwitch SXid lines, "fallen off the bus",
PCIe AER fatal / uncorrectable errors, InfiniBand link down, thermal shutdown, GSP timeouts and the
OOM killer. Only the kernel's own records count (facility 0: ``prio >> 3 == 0``); a record a process
wrote (``/dev/kmsg`` gives every user-space writer a facility of its own, never 0) is dropped. And a
kernel record counts only as its driver writes it: the message *starts* with the driver's text
(``NVRM: …``, ``nvidia-nvswitchN: SXid …``, ``pcieport <dev>: AER: …``, ``mlx5_core …``); the kernel's
records of a user process (``traps: <comm>[<pid>] trap … in <file>[…]``, ``<comm>[<pid>]: segfault at
…``, ``general protection``) are dropped whatever the job named its process or its files. Each record
is one line (a line break the journal restored in it is escaped again, ``failover.xids.one_line``), so
no part of one is ever read as a record of its own. Each source keeps a cursor, so a line is returned
once: an old Xid still in the ring never re-flags a node an operator has cleared.

Sources, in order: ``/dev/kmsg`` (records ``prio,seq,usec,flags;message``; the cursor is the
sequence number; read non-blocking), then ``journalctl -k`` (the cursor is the journal's), then
``dmesg --raw`` (the cursor is the record's timestamp). Where none can be read the reader says so
in ``problem`` (the node's health shows it) instead of returning nothing silently.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import subprocess
import time
from dataclasses import dataclass

from failover.xids import one_line, parse_kernel_line

KMSG_PATH = "/dev/kmsg"
KERNEL_FACILITY = 0


def kept(message: str) -> bool:
    """Whether a kernel message is one the product reads (``failover.xids.parse_kernel_line``)."""
    return parse_kernel_line(message) is not None


def from_kernel(prio: int) -> bool:
    """Whether a record's syslog priority (facility × 8 + level) is the kernel's facility."""
    return prio >> 3 == KERNEL_FACILITY


_DMESG_RAW = re.compile(r"^<(\d+)>\[\s*(\d+\.\d+)\]\s?(.*)$")


@dataclass(frozen=True)
class KernelLine:
    seq: int | None  # /dev/kmsg sequence number (None from journalctl / dmesg)
    at: float  # wall-clock time the kernel wrote it (seconds since the epoch)
    text: str
    source: str  # "kmsg" | "journalctl" | "dmesg"


def boot_time() -> float:
    return time.time() - time.monotonic()


class KernelLogReader:
    """One per node agent; not thread-safe (the health monitor's thread calls it)."""

    def __init__(self, path: str = KMSG_PATH, *, fallbacks: bool = True, booted: float | None = None) -> None:
        self.path = path
        self.fallbacks = fallbacks
        self.booted = boot_time() if booted is None else booted
        self.fd: int | None = None
        self.partial = b""
        self.seq: int | None = None  # the last /dev/kmsg record read
        self.journal_cursor: str | None = None
        self.dmesg_stamp: float | None = None
        self.source = ""  # where the last read came from
        self.problem = ""  # why /dev/kmsg (or every source) could not be read; "" when it could

    def read(self) -> list[KernelLine]:
        """The kept lines written since the last call (the kernel's backlog on the first)."""
        try:
            lines = self.read_kmsg()
            self.source, self.problem = "kmsg", ""
            return lines
        except OSError as exc:
            self.close()
            why = f"{self.path}: {exc.strerror or exc}"
        if not self.fallbacks:
            self.source, self.problem = "", f"kernel log unreadable ({why})"
            return []
        for name, reader in (("journalctl", self.read_journal), ("dmesg", self.read_dmesg)):
            try:
                lines = reader()
            except (OSError, subprocess.SubprocessError, ValueError) as exc:
                why += f"; {name}: {exc}"
                continue
            self.source, self.problem = name, f"kernel log read through {name} ({why})"
            return lines
        self.source, self.problem = "", f"kernel log unreadable ({why})"
        return []

    def close(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None
            self.partial = b""

    # --- /dev/kmsg --------------------------------------------------------------------------
    def read_kmsg(self) -> list[KernelLine]:
        if self.fd is None:
            self.fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        out: list[KernelLine] = []
        while True:
            try:
                chunk = os.read(self.fd, 8192)  # /dev/kmsg: one record per read
            except BlockingIOError:
                break  # nothing more now
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    continue  # records were overwritten before we read them: go on from the next
                raise
            if not chunk:
                break  # a file or a FIFO without a writer: the end for now
            data = self.partial + chunk
            *records, self.partial = data.split(b"\n")
            for record in records:
                line = self.parse_record(record.decode("utf-8", "replace"))
                if line is not None:
                    out.append(line)
        return out

    def parse_record(self, record: str) -> KernelLine | None:
        if not record or record[0] == " ":
            return None  # a continuation line (" KEY=value" dictionary of the record above)
        header, sep, message = record.partition(";")
        fields = header.split(",")
        if not sep or len(fields) < 3:
            return None
        try:
            prio, seq, usec = int(fields[0]), int(fields[1]), int(fields[2])
        except ValueError:
            return None
        if self.seq is not None and seq <= self.seq:
            return None  # the cursor has passed it
        self.seq = seq
        if not from_kernel(prio) or not kept(message):
            return None
        return KernelLine(seq=seq, at=self.booted + usec / 1e6, text=one_line(message), source="kmsg")

    # --- fallbacks --------------------------------------------------------------------------
    def read_journal(self) -> list[KernelLine]:
        command = ["journalctl", "-k", "-o", "json", "--no-pager", "-q"]
        command += [f"--after-cursor={self.journal_cursor}"] if self.journal_cursor else ["-b", "-n", "5000"]
        result = subprocess.run(command, check=False, capture_output=True, text=True, timeout=10)
        if result.returncode != 0:
            raise OSError(result.stderr.strip()[:200] or f"exit {result.returncode}")
        out: list[KernelLine] = []
        for raw in result.stdout.splitlines():
            entry = json.loads(raw)
            self.journal_cursor = entry.get("__CURSOR", self.journal_cursor)
            message = entry.get("MESSAGE")
            if isinstance(message, list):  # journald stores non-UTF-8 text as bytes
                message = bytes(message).decode("utf-8", "replace")
            facility = entry.get("SYSLOG_FACILITY", "0")
            transport = entry.get("_TRANSPORT", "kernel")
            if isinstance(message, str) and transport == "kernel" and str(facility) == "0" and kept(message):
                at = int(entry.get("__REALTIME_TIMESTAMP", 0)) / 1e6 or time.time()
                out.append(KernelLine(seq=None, at=at, text=one_line(message), source="journalctl"))
        return out

    def read_dmesg(self) -> list[KernelLine]:
        result = subprocess.run(["dmesg", "--raw"], check=False, capture_output=True, text=True, timeout=10)
        if result.returncode != 0:
            raise OSError(result.stderr.strip()[:200] or f"exit {result.returncode}")
        out: list[KernelLine] = []
        for raw in result.stdout.splitlines():
            match = _DMESG_RAW.match(raw)
            if not match:
                continue
            stamp = float(match[2])
            if self.dmesg_stamp is not None and stamp <= self.dmesg_stamp:
                continue
            self.dmesg_stamp = stamp
            if from_kernel(int(match[1])) and kept(match[3]):
                out.append(KernelLine(seq=None, at=self.booted + stamp, text=one_line(match[3]), source="dmesg"))
        return out
