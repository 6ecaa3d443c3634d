"""The CUDA staging path's order of calls, run on the CPU against a recording stand-in for
``torch.cuda`` (the NVIDIA-driver boundary): tensors marked as "on the device" are copied through
``DeviceCopies`` exactly as on a GPU, and the stand-in records every stream call. It checks the
rules of ``ckptlib._device.DeviceCopies``; it cannot show that a GPU obeys them
(``python -m ckptlib.tests.gpu_check`` does, on a GPU)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
import torch

import ckptlib
import ckptlib._device as _device
import ckptlib._stage as _stage
from ckptlib.tests import gpu_check
from ckptlib.tests.helpers import assert_same, snapshot


class _Cuda:
    """Records ``(what, object id, ...)`` for every call the staging code makes."""

    def __init__(self) -> None:
        self.log: list[tuple[Any, ...]] = []
        self.compute = _Stream(self, "compute")
        self.active: list[Any] = [self.compute]

    def is_available(self) -> bool:
        return True

    def current_stream(self, device: Any = None) -> Any:
        return self.active[-1]

    def Stream(self, device: Any = None) -> Any:  # torch.cuda's name
        return _Stream(self, f"copy-{len(self.log)}")

    def Event(self) -> Any:
        return _Event(self)

    @contextlib.contextmanager
    def stream(self, stream: Any) -> Any:
        self.active.append(stream)
        try:
            yield
        finally:
            self.active.pop()


class _Stream:
    def __init__(self, cuda: _Cuda, name: str) -> None:
        self.cuda, self.name = cuda, name

    def wait_event(self, event: Any) -> None:
        self.cuda.log.append(("wait_event", self.name, event))

    def wait_stream(self, stream: Any) -> None:
        self.cuda.log.append(("wait_stream", self.name, stream.name))

    def synchronize(self) -> None:
        self.cuda.log.append(("synchronize", self.name))


class _Event:
    def __init__(self, cuda: _Cuda) -> None:
        self.cuda = cuda

    def record(self, stream: Any) -> None:
        self.cuda.log.append(("record", stream.name, self))

    def synchronize(self) -> None:
        self.cuda.log.append(("event_synchronize", self))


def test_device_copies_wait_for_save_record_their_sources_and_finish_before_the_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = _Cuda()
    on_device: set[int] = set()  # storages standing for device memory

    def on_a_device(tensor: torch.Tensor) -> bool:
        return tensor.untyped_storage().data_ptr() in on_device

    monkeypatch.setattr(_stage, "is_device", on_a_device)
    monkeypatch.setattr(_device, "is_device", on_a_device)
    monkeypatch.setattr(_device, "_record_stream", lambda t, s: cuda.log.append(("record_stream", s.name, t.data_ptr())))

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    state = {"model": model, "optimizer": optimizer}

    def step() -> None:
        model(torch.randn(4, 64)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()

    step()  # optimizer state exists from here on; all of it stands for device memory
    on_device.update(t.untyped_storage().data_ptr() for t in model.parameters())
    on_device.update(t.untyped_storage().data_ptr() for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t))
    engine = ckptlib.CheckpointEngine(output_dir=tmp_path, host_cache_size=0.001, handle_signals=False)
    engine._stager._device = _device.DeviceCopies(cuda)
    in_flight_at_step = []
    expected = {}
    try:
        for number in range(1, 4):
            expected[number] = snapshot(state)
            mark = len(cuda.log)
            assert engine.save(state, step=number, capture_rng=False)
            if number == 1:
                # Registered after the engine's own pre-step hook: runs once staging is forced.
                optimizer.register_step_pre_hook(lambda *_: in_flight_at_step.append(list(engine._stager._device._in_flight)))
            save_events = [entry[2] for entry in cuda.log[mark:] if entry[0] == "record" and entry[1] == "compute"]
            assert len(save_events) == 1  # rule 1: the compute stream marked at save()
            step()
            copies_log = cuda.log[mark:]
            waits = [entry for entry in copies_log if entry[0] == "wait_event"]
            assert waits and all(entry[2] is save_events[0] for entry in waits)
            first_record_stream = next(i for i, e in enumerate(copies_log) if e[0] == "record_stream")
            assert copies_log.index(waits[0]) < first_record_stream  # waited before any copy
            assert any(entry[0] == "synchronize" for entry in copies_log)  # rule 3
        engine.wait(persist=True)
        assert in_flight_at_step and all(pending == [] for pending in in_flight_at_step)  # rule 3
        sources = {entry[2] for entry in cuda.log if entry[0] == "record_stream"}
        assert sources  # rule 2: every device source told to the allocator
        chunk_events = {id(entry[2]) for entry in cuda.log if entry[0] == "record" and entry[1] != "compute"}
        synchronized = {id(entry[1]) for entry in cuda.log if entry[0] == "event_synchronize"}
        assert chunk_events and chunk_events <= synchronized  # rule 4: the writer waited for each chunk
        assert engine.staging_stats()["live_bytes"] == 0  # device memory is never written live
        for number, values in expected.items():
            loaded = engine.load(number).state
            for key, value in values.items():
                assert_same(value, loaded[key], f"step {number} {key}")
    finally:
        engine.shutdown()


def test_the_cpu_path_makes_no_cuda_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class NoCuda(_Cuda):
        def is_available(self) -> bool:
            return False

    cuda = NoCuda()
    engine = ckptlib.CheckpointEngine(output_dir=tmp_path, host_cache_size=0.001, handle_signals=False)
    engine._stager._device = _device.DeviceCopies(cuda)
    try:
        model = torch.nn.Linear(8, 8)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        engine.save({"model": model, "optimizer": optimizer}, step=1)
        model(torch.randn(2, 8)).sum().backward()
        optimizer.step()
        engine.wait(persist=True)
        assert cuda.log == []
        assert engine.committed_steps() == [1]
    finally:
        engine.shutdown()


def test_the_gpu_check_script_runs_here(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``gpu_check`` is importable here; without a GPU it checks nothing and says so (status 2)."""
    monkeypatch.setattr("sys.argv", ["gpu_check", "--steps", "3", "--out", str(tmp_path)])
    assert gpu_check.main() == (0 if torch.cuda.is_available() else 2)
