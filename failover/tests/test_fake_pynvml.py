"""The fake pynvml the NVML backend is tested with speaks the real nvidia-ml-py's language: every
function it defines exists in the installed ``pynvml`` with the same parameters, every constant
has the same value, every error class the same name, base and code."""

from __future__ import annotations

import inspect

import pytest

from failover.tests import fake_pynvml as fake

real = pytest.importorskip("pynvml")  # nvidia-ml-py, a dependency of the project


def public(kind):
    return {
        name: value
        for name, value in vars(fake).items()
        if not name.startswith("_") and getattr(value, "__module__", fake.__name__) == fake.__name__ and kind(name, value)
    }


FUNCTIONS = public(lambda name, value: name.startswith("nvml") and inspect.isfunction(value))
CONSTANTS = public(lambda name, value: (name.startswith("NVML_") or name.startswith("nvml")) and isinstance(value, int))
ERRORS = public(lambda name, value: name.startswith("NVMLError") and inspect.isclass(value))


def test_the_fake_covers_what_the_probe_calls():
    assert {"nvmlInit", "nvmlShutdown", "nvmlEventSetCreate", "nvmlEventSetWait", "nvmlEventSetFree", "nvmlDeviceGetNvLinkState"} <= set(FUNCTIONS)
    assert len(CONSTANTS) > 20 and "NVMLError_GpuIsLost" in ERRORS


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_each_function_has_the_real_name_and_parameters(name):
    assert hasattr(real, name), f"pynvml has no {name}"
    ours = list(inspect.signature(FUNCTIONS[name]).parameters)
    theirs = list(inspect.signature(getattr(real, name)).parameters)
    assert len(ours) == len(theirs), (name, ours, theirs)
    assert ours == theirs, (name, ours, theirs)


@pytest.mark.parametrize("name", sorted(CONSTANTS))
def test_each_constant_has_the_real_value(name):
    assert getattr(real, name) == CONSTANTS[name]


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_each_error_class_is_the_real_one_by_name_and_code(name):
    theirs = getattr(real, name)
    assert issubclass(theirs, real.NVMLError)
    if name != "NVMLError":
        code = ERRORS[name](0).value  # the subclass fixes its own code
        assert theirs(0).value == code
        assert type(real.NVMLError(code)).__name__ == type(fake.NVMLError(code)).__name__ == name
