"""The writer threads: they write what staging hands over, and stage when training does not.

Order of calls for one file (``ckptlib._writer.FileSink``): the stager ``put``s its items (staged
chunks, live ranges written without a copy, or gathered items the writer copies into its own
buffer first) and then an end marker; a writer writes each item (the items queued behind it
that continue the same file's bytes with it, in one ``pwritev``: ``_write_batch``)
and gives its chunk back to the host cache; whoever writes the file's last item closes it (fsync),
and whoever closes a job's last file calls ``finished(job)`` (the commit, on that thread).
``stop`` puts one end-of-work marker per thread and joins them.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

from ckptlib._cache import PAGE, Chunk, HostCache
from ckptlib._inflight import InFlightCheckpoint
from ckptlib._stage import Stager, copy_segments
from ckptlib._writer import FileSink, WriteItem

_POLL_S = 0.05
_IDLE_STAGING_S = 0.2
# Consecutive items of a file written with one pwritev: at most this many, of at most this many
# bytes each and in all (larger items are written alone: their system call's cost is small
# beside their bytes, and other writers may take them in parallel).
_BATCH_ITEMS = 256
_BATCH_ITEM_BYTES = 8 << 20
_BATCH_BYTES = 32 << 20
_NOTHING = object()


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
        finished: Callable[[InFlightCheckpoint], None],
    ) -> None:
        self._items = items
        self._stager = stager
        self._cache = cache
        self._keep_bytes = keep_bytes
        self._finished = finished
        self._local = threading.local()
        self._threads = [threading.Thread(target=self._write_loop, name=f"ckptlib-writer-{i}", daemon=True) for i in range(count)]

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
        carried: WriteItem | object | None = _NOTHING  # taken from the queue, not batchable
        while True:
            if carried is not _NOTHING:
                item, carried = carried, _NOTHING
            else:
                try:
                    # Poll only while a checkpoint is staging: an idle thread waking 20 times a
                    # second measurably slowed a 2-core training loop (its steps took 7 % longer).
                    item = self._items.get(timeout=None if self._stager.idle else _POLL_S)
                except queue.Empty:
                    if not self._stager.idle and time.monotonic() - self._stager.last_run > _IDLE_STAGING_S:
                        # Training has not reached a staging point for a while: stage in its place.
                        self._stager.run(force=False)
                    continue
            if item is None:
                return
            assert isinstance(item, WriteItem)
            if not self._batchable(item):
                self._write(item)
            else:
                batch, carried = self._take_batch(item)
                if len(batch) == 1:
                    self._write(item)
                else:
                    self._write_batch(batch)
            if carried is _NOTHING and self._items.empty() and not self._stager.idle and self._stager.handed_over:
                # Every byte is handed over and the queue is empty: retire the checkpoints whose
                # items are all written now (a short, non-blocking run), so this thread goes to
                # sleep instead of polling. Each poll wakes it on a core training uses.
                self._stager.run(force=False)

    @staticmethod
    def _batchable(item: WriteItem) -> bool:
        """Whether an item may share a system call: whole pages of CPU memory, not too large."""
        return (
            not item.end
            and item.ready is None
            and item.length % PAGE == 0
            and 0 < item.length <= _BATCH_ITEM_BYTES
            and (item.chunk is not None or item.live is not None or item.gather is not None)
        )

    def _take_batch(self, first: WriteItem) -> tuple[list[WriteItem], WriteItem | object | None]:
        """``first`` and the items queued right behind it that continue its file's bytes: one
        ``pwritev`` writes them all. Returns the batch and the first item taken that does not
        belong to it (``_NOTHING`` if none)."""
        batch = [first]
        total = first.length
        gathered = first.length if first.gather is not None else 0
        while len(batch) < _BATCH_ITEMS:
            try:
                candidate = self._items.get_nowait()
            except queue.Empty:
                return batch, _NOTHING
            last = batch[-1]
            if (
                candidate is None
                or candidate.sink is not first.sink
                or candidate.offset != last.offset + last.length
                or not self._batchable(candidate)
                or total + candidate.length > _BATCH_BYTES
                or (candidate.gather is not None and gathered + candidate.length > self._stager.gather_bytes)
            ):
                return batch, candidate
            batch.append(candidate)
            total += candidate.length
            if candidate.gather is not None:
                gathered += candidate.length
        return batch, _NOTHING

    def _write_batch(self, batch: list[WriteItem]) -> None:
        """Writes consecutive items of one file with as few system calls as revocations allow.

        Each item is claimed as ``_write`` would (a live or gathered item the pre-step hook
        revoked is skipped: its copy comes as other items); gathered items are copied into this
        thread's buffer, back to back, and released at once; live items are released once written.
        """
        job, sink = batch[0].job, batch[0].sink
        run: list[WriteItem] = []
        views: list[memoryview] = []
        used = 0
        for item in batch:
            view = None
            if item.chunk is not None:
                if job.error is None:
                    view = memoryview(item.chunk.mem)[: item.length]
            elif item.live is not None:
                if self._stager.begin_live_write(item) and job.error is None:
                    view = memoryview(item.live.numpy())
            elif self._stager.begin_live_write(item):
                if job.error is None:
                    view = self._copy_gathered(item, used)
                    used += item.length
                else:
                    self._stager.end_live_write(item)
            if view is None:  # revoked or failed: what was collected goes in one call
                self._write_run(job, sink, run, views)
                run, views = [], []
            else:
                run.append(item)
                views.append(view)
        self._write_run(job, sink, run, views)
        for item in batch:
            if item.chunk is not None:
                self._cache.release(item.chunk, keep_bytes=self._keep_bytes)
            elif item.live is not None:
                self._stager.end_live_write(item)  # written, revoked, or its job failed
            if sink.done_one():
                self._close_file(job, sink)

    def _copy_gathered(self, item: WriteItem, used: int) -> memoryview | None:
        """Copies a claimed gathered item into this thread's buffer at ``used`` and releases its
        live memory. Returns the copy's view, or None if the copy failed (the job fails)."""
        view = None
        try:
            buffer = self._local.buffer
            if buffer is None:
                buffer = self._local.buffer = Chunk(self._stager.gather_bytes, pin=False)
            assert item.gather is not None and used + item.length <= buffer.size
            copy_segments(buffer.array[used : used + item.length], item.gather)
            view = memoryview(buffer.mem)[used : used + item.length]
        except Exception as error:  # reported, training goes on
            item.job.fail_in_flight(f"writing {item.sink.path.name} failed: {error}")
        finally:
            # Live memory is no longer read: the next optimizer step may go on.
            self._stager.end_live_write(item, gathered=view is not None)
        return view

    def _write_run(self, job: InFlightCheckpoint, sink: FileSink, run: list[WriteItem], views: list[memoryview]) -> None:
        try:
            if run and job.error is None:
                sink.write_vectors(run[0].offset, views)
                with job.lock:
                    job.bytes += sum(item.length for item in run)
        except Exception as error:  # reported, training goes on
            job.fail_in_flight(f"writing {sink.path.name} failed: {error}")
        finally:
            for view in views:  # a chunk given back may be unmapped: no view may outlive this
                view.release()

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
            except Exception as error:  # reported, training goes on
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
        if job.error is not None:
            self._stager.end_live_write(item)
            return
        view = self._copy_gathered(item, 0)
        if view is None:
            return
        view.release()
        try:
            sink.write(item, buffer=self._local.buffer.mem)
            with job.lock:
                job.bytes += item.length
        except Exception as error:  # reported, training goes on
            job.fail_in_flight(f"writing {sink.path.name} failed: {error}")

    def _close_file(self, job: InFlightCheckpoint, sink: FileSink) -> None:
        try:
            sink.close(durable=job.error is None)
        except Exception as error:
            job.fail_in_flight(f"writing {sink.path.name} failed: {error}")
        with job.lock:
            job.files_left -= 1
            last = job.files_left == 0
        if last:
            self._finished(job)
