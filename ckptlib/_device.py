"""Copies from CUDA tensors into host chunks, for staging (``ckptlib._stage``).

``DeviceCopies`` holds the stream rules and their reasons. **Unverified on a GPU**: its order of
calls is tested on the CPU against a recording stand-in for ``torch.cuda``
(``tests/test_cuda_staging_logic.py``); ``python -m ckptlib.tests.gpu_check`` checks it on a GPU.
"""

from __future__ import annotations

import threading
from typing import Any

import torch


def is_device(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is on an accelerator (copied on a side stream, never written live)."""
    return not tensor.is_cpu  # a property: no device object made (called per piece staged)


def _record_stream(tensor: torch.Tensor, stream: Any) -> None:
    tensor.record_stream(stream)


class _Ready:
    """The events a chunk's copies end with, one per copy stream used (several devices)."""

    __slots__ = ("events",)

    def __init__(self, events: list[Any]) -> None:
        self.events = events

    def synchronize(self) -> None:
        for event in self.events:
            event.synchronize()


class DeviceCopies:
    """Copies from CUDA tensors into host chunks on one side stream per device.

    UNVERIFIED ON A GPU: written by the CUDA stream rules below; on the CPU its order of calls is
    tested against a recording stand-in for ``torch.cuda``; ``ckptlib/tests/gpu_check.py`` is
    the check to run on a GPU. The rules, and why:

    1. **The copy stream waits for the compute stream as it was at ``save()``** (``mark_save``
       records an event on each device's current stream, on the training thread; the copy stream
       ``wait_event``s it before its first copy of that checkpoint, which is
       ``copy_stream.wait_stream(compute_stream)`` taken at ``save()`` time). Kernels run
       asynchronously: when ``save()`` returns, the optimizer step that produced the state may
       still be running, and a copy issued on another stream without this wait could read the
       parameters half updated. The event is recorded at ``save()`` rather than taken from
       ``torch.cuda.current_stream()`` at copy time because copies may be issued from a writer
       thread, whose current stream is not the training stream.
    2. **The allocator learns the copy stream uses each source** (``record_stream``). Sources
       that only the checkpoint holds (buffers cloned at ``save()``, contiguous copies) are
       dropped as soon as their bytes are handed over, while the copy may still be queued; the
       caching allocator would then hand their memory to the next kernel on the compute stream.
       ``record_stream(copy_stream)`` keeps the block out of reuse until the copy stream's work
       queued so far has finished.
    3. **Nothing changes the sources before their copies have finished**: the optimizer's
       pre-step hook (``run(force=True)``) ``synchronize()``s every copy stream with copies in
       flight before it returns, so the step's kernels, queued after it, cannot overwrite a
       parameter or optimizer state still being read. Forward and backward between ``save()``
       and that hook do not write parameters or optimizer state, and what they do write
       (BatchNorm statistics) was cloned at ``save()``.
    4. **The host reads a chunk only after its copies have finished**: each chunk carries the
       events recorded on its copy streams after its last copy (``chunk_ready``); the writer
       synchronizes them before writing the chunk (pinned chunks make the copies asynchronous).
    5. A non-contiguous source is made contiguous on the copy stream, after the wait: a kernel
       on the thread's current stream would not be ordered after the compute stream.

    Args:
        cuda: ``torch.cuda`` (a stand-in in the CPU test of this logic).
    """

    def __init__(self, cuda: Any = None) -> None:
        self.cuda = cuda if cuda is not None else torch.cuda
        self._streams: dict[Any, Any] = {}
        self._in_flight: list[Any] = []  # copy streams with copies not yet synchronized
        self._lock = threading.Lock()

    @property
    def in_flight(self) -> bool:
        return bool(self._in_flight)

    def mark_save(self, plan: Any) -> dict[Any, Any]:
        """On the training thread at ``save()``: an event on each used device's compute stream."""
        if not self.cuda.is_available():
            return {}  # the CPU path: nothing to order
        devices = {slot.source.device for file in plan.files for slot in file.slots if slot.source is not None and is_device(slot.source)}
        events = {}
        for device in devices:
            event = self.cuda.Event()
            event.record(self.cuda.current_stream(device))
            events[device] = event
        return events

    def _stream_for(self, cursor: Any, device: Any) -> Any:
        stream = self._streams.get(device)
        if stream is None:
            stream = self._streams[device] = self.cuda.Stream(device=device)
        if device not in cursor.device_waited:
            event = cursor.saved_events.get(device)
            if event is not None:
                stream.wait_event(event)  # rule 1
            else:  # a device seen only now (not in the plan at save): wait for its stream now
                stream.wait_stream(self.cuda.current_stream(device))
            cursor.device_waited.add(device)
        return stream

    def byte_view(self, cursor: Any, tensor: torch.Tensor) -> torch.Tensor:
        """The tensor's bytes as a flat ``uint8`` tensor, ready to be copied from."""
        tensor = tensor.detach()
        if not tensor.is_contiguous():
            stream = self._stream_for(cursor, tensor.device)
            _record_stream(tensor, stream)  # rule 2 (read by the contiguous copy)
            with self.cuda.stream(stream):  # rule 5
                tensor = tensor.contiguous()
        return tensor.reshape(-1).view(torch.uint8)

    def copy(self, cursor: Any, target: torch.Tensor, source: torch.Tensor) -> None:
        stream = self._stream_for(cursor, source.device)
        _record_stream(source, stream)  # rule 2
        with self.cuda.stream(stream):
            target.copy_(source, non_blocking=True)
        if stream not in cursor.chunk_streams:
            cursor.chunk_streams.append(stream)
        with self._lock:
            if stream not in self._in_flight:
                self._in_flight.append(stream)

    def chunk_ready(self, streams: list[Any]) -> _Ready | None:
        """Rule 4: events after the chunk's last copies on each stream used (None: CPU only)."""
        if not streams:
            return None
        events = []
        for stream in streams:
            event = self.cuda.Event()
            event.record(stream)
            events.append(event)
        return _Ready(events)

    def synchronize(self) -> None:
        """Rule 3: returns once every copy issued so far has finished."""
        with self._lock:
            streams, self._in_flight = self._in_flight, []
        for stream in streams:
            stream.synchronize()
