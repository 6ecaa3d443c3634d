"""Small models, states and comparisons shared by the tests."""

from __future__ import annotations

import copy
import logging
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch


def small_training_state(seed: int = 0) -> dict[str, Any]:
    """A model with buffers and a bf16 parameter, AdamW with state, and a scheduler."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    model.register_parameter("scale", torch.nn.Parameter(torch.ones(3, dtype=torch.bfloat16)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    return {"model": model, "optimizer": optimizer, "scheduler": scheduler}


def train_steps(state: dict[str, Any], steps: int) -> list[float]:
    model, optimizer, scheduler = state["model"], state["optimizer"], state["scheduler"]
    losses = []
    for _ in range(steps):
        inputs = torch.randn(8, 16)
        loss = model(inputs).pow(2).mean() + model.scale.float().sum() * 0.01
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
        losses.append(loss.item())
    return losses


def assert_same(expected: Any, actual: Any, where: str = "state") -> None:
    """Bit-exact comparison of nested state dicts (tensors by bytes, dtype and shape)."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), where
        assert expected.dtype == actual.dtype and expected.shape == actual.shape, where
        assert torch.equal(expected.view(torch.uint8) if expected.dtype == torch.bool else expected, actual), where
        return
    if isinstance(expected, dict):
        assert set(expected) == set(actual), where
        for key in expected:
            assert_same(expected[key], actual[key], f"{where}.{key}")
        return
    if isinstance(expected, (list, tuple)):
        assert len(expected) == len(actual), where
        for index, (left, right) in enumerate(zip(expected, actual, strict=True)):
            assert_same(left, right, f"{where}[{index}]")
        return
    assert expected == actual, where


def clone_state(value: Any) -> Any:
    """A deep copy of a state dict with its tensors cloned (on their own device, in stream order
    on a GPU), several times faster than ``copy.deepcopy``: a child's loop should spend its time
    in ``optimizer.step()``, where the signals are meant to land."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {key: clone_state(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(clone_state(item) for item in value)
    return copy.deepcopy(value)


def snapshot(state: dict[str, Any]) -> dict[str, Any]:
    """Deep copies of the state dicts, as they are now."""
    return {key: copy.deepcopy(value.state_dict()) for key, value in state.items()}


class RecordingHandler(logging.Handler):
    """Collects formatted messages of ckptlib's loggers (which do not propagate to root)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def in_optimizer_step(frame: Any) -> bool:
    """Inside ``optimizer.step()``; under DeepSpeed, inside the engine's ``step()`` (ZeRO's
    optimizer step: Adam on the flat fp32 partition, then the copy back into the parameters)."""
    while frame is not None:
        code = frame.f_code
        if code.co_name in {"step", "_single_tensor_adam", "adam"} and "optim" in code.co_filename:
            return True
        if code.co_name in {"step", "_take_model_step"} and "deepspeed" in code.co_filename:
            return True
        frame = frame.f_back
    return False


def arm_self_signal(optimizer: torch.optim.Optimizer, current_step: Any, *, at: int, landed_file: Path, rng: random.Random) -> None:
    """For the SIGTERM tests' children: every SIGTERM writes where it landed ("optimizer.step" or
    "elsewhere") to ``landed_file`` before ckptlib's handler runs; with ``at`` > 0 the process
    signals itself inside ``optimizer.step()`` of step ``at``: a thread released by the pre-step
    hook watches the main thread's stack and signals once it is in Adam's loop, after a random
    number of parameters (a step missed on a busy machine is caught at a later one)."""
    ckptlib_handler = signal.getsignal(signal.SIGTERM)

    def landed(signum: int, frame: Any) -> None:
        landed_file.write_text("optimizer.step" if in_optimizer_step(frame) else "elsewhere")
        if callable(ckptlib_handler):
            ckptlib_handler(signum, frame)

    signal.signal(signal.SIGTERM, landed)
    main = threading.main_thread().ident
    assert main is not None  # the main thread is running

    def signal_inside() -> None:
        time.sleep(rng.uniform(0.0, 0.002))
        while True:
            if in_optimizer_step(sys._current_frames().get(main)):
                os.kill(os.getpid(), signal.SIGTERM)
                return
            time.sleep(0.0002)

    def before_step(*_args: Any) -> None:
        if at and current_step() + 1 == at:
            sys.setswitchinterval(0.0002)  # the watching thread gets the interpreter often
            threading.Thread(target=signal_inside, daemon=True).start()

    optimizer.register_step_pre_hook(before_step)
