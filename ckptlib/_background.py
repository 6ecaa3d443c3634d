"""The writer threads: they write what staging hands over, and stage when training does not.

Order of calls for one file (``ckptlib._writer.FileSink``): the stager ``put``s its items (staged
chunks, live ranges written without a copy, or gathered items the writer copies into its own
buffer first) and then an end marker; a writer writes each item
and gives its chunk back to the host cache; whoever writes the file's last item closes it (fsync),
and whoever closes a job's last file calls ``finished(job)`` (the commit, on that thread).
``stop`` puts one end-of-work marker per thread and joins them.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

from ckptlib._cache import Chunk, HostCache
from ckptlib._jobs import Job
from ckptlib._stage import Stager, copy_segments
from ckptlib._writer import FileSink, WriteItem

_POLL_S = 0.05
_IDLE_STAGING_S = 0.2


class BackgroundWriters:
    """``count`` daemon threads taking ``WriteItem``s from one queue.

    Args:
        items: The queue the stager hands items over to (``None``: a thread returns).
        count: Threads.
        stager: Staged from when training reaches no staging point for a while.
        cache: Where written chunks go back to.
        keep_bytes: Chunks kept for reuse when one is given back.
        finished: Called with a job once its last file is closed.
    """

    def __init__(
        self,
        items: queue.Queue[WriteItem | None],
        *,
        count: int,
        stager: Stager,
        cache: HostCache,
        keep_bytes: int,
        finished: Callable[[Job], None],
    ) -> None:
        self._items = items
        self._stager = stager
        self._cache = cache
        self._keep_bytes = keep_bytes
        self._finished = finished
        self._local = threading.local()
        self._threads = [
            threading.Thread(target=self._write_loop, name=f"ckptlib-writer-{i}", daemon=True) for i in range(count)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self, *, join_timeout: float) -> None:
        """Ends every thread once the items queued before have been written; waits up to
        ``join_timeout`` for each (0: not at all)."""
        for _ in self._threads:
            self._items.put(None)
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout=join_timeout)

    def _write_loop(self) -> None:
        # This thread's buffer for gathered items, made at its first one and kept: outside the
        # host cache's bound, so a writer never waits for chunks that only a writer gives back.
        self._local.buffer = None
        while True:
            try:
                # Poll only while a checkpoint is staging: an idle thread waking 20 times a second
                # measurably slowed a 2-core training loop (its steps took 7 % longer).
                item = self._items.get(timeout=None if self._stager.idle else _POLL_S)
            except queue.Empty:
                if not self._stager.idle and time.monotonic() - self._stager.last_run > _IDLE_STAGING_S:
                    # Training has not reached a staging point for a while: stage in its place.
                    self._stager.run(force=False)
                continue
            if item is None:
                return
            self._write(item)

    def _write(self, item: WriteItem) -> None:
        job, sink = item.job, item.sink
        if item.end:
            if sink.end():
                self._close_file(job, sink)
            return
        if item.gather is not None:
            self._write_gathered(item)
        elif item.chunk is not None or item.live is not None:
            live_ok = item.live is None or self._stager.begin_live_write(item)
            try:
                if item.ready is not None:
                    item.ready.synchronize()
                if job.error is None and live_ok:
                    sink.write(item)
                    with job.lock:
                        job.bytes += item.length
            except Exception as error:  # noqa: BLE001 - reported, training goes on
                job.fail_in_flight(f"writing {sink.path.name} failed: {error}")
            finally:
                if item.chunk is not None:
                    self._cache.release(item.chunk, keep_bytes=self._keep_bytes)
                if item.live is not None:
                    self._stager.end_live_write(item)
        if sink.done_one():
            self._close_file(job, sink)

    def _write_gathered(self, item: WriteItem) -> None:
        job, sink = item.job, item.sink
        if not self._stager.begin_live_write(item):
            return  # revoked: the stager copied it and handed the copy over
        buffer = None
        try:
            if job.error is None:
                buffer = self._local.buffer
                if buffer is None:
                    buffer = self._local.buffer = Chunk(self._stager.gather_bytes, pin=False)
                assert item.gather is not None and item.length <= buffer.size
                copy_segments(buffer.array[: item.length], item.gather)
        except Exception as error:  # noqa: BLE001 - reported, training goes on
            job.fail_in_flight(f"writing {sink.path.name} failed: {error}")
            buffer = None
        finally:
            # Live memory is no longer read: the next optimizer step may go on.
            self._stager.end_live_write(item, gathered=buffer is not None)
        if buffer is None:
            return
        try:
            sink.write(item, buffer=buffer.mem)
            with job.lock:
                job.bytes += item.length
        except Exception as error:  # noqa: BLE001 - reported, training goes on
            job.fail_in_flight(f"writing {sink.path.name} failed: {error}")

    def _close_file(self, job: Job, sink: FileSink) -> None:
        try:
            sink.close(durable=job.error is None)
        except Exception as error:  # noqa: BLE001
            job.fail_in_flight(f"writing {sink.path.name} failed: {error}")
        with job.lock:
            job.files_left -= 1
            last = job.files_left == 0
        if last:
            self._finished(job)
