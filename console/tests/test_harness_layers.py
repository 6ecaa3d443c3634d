"""The tests keep the apps' floors, and the test harness stays out of the product.

* an app's tests import test code of their own app or a lower one (and ``harness``), never a
  higher app's tests: the floors, bottom first, are jobs < logs < agent < failover < notify <
  console (``test_architecture.py`` checks them for the product code); ckptlib's and the client's
  tests, and the harness itself, import no app's tests at all;
* nothing imports ``console.testing`` (the fixtures that lived there are the harness's now);
* no product module (a package ``pyproject.toml`` installs, or the client's) imports ``harness``
  or pytest: a product package ships no test helpers.

Imports are read from the source with ``ast`` (imports inside functions count), not run.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

from harness.sources import walked

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ["jobs", "logs", "agent", "failover", "notify", "console"]
# Test code beside the apps: it may import the harness and product code, but no app's tests.
OUTSIDE_THE_FLOORS = ["ckptlib/tests", "client/tests", "harness"]
TEST_FIXTURE_MODULES = ("console.testing",)
TEST_ONLY_PACKAGES = ("harness", "pytest", "_pytest")


def imported_modules(path: Path, root: Path = ROOT) -> list[tuple[int, tuple[str, ...]]]:
    """What each import of the file may name, with its line: ``import a.b`` names ``a.b``;
    ``from a.b import c`` names ``a.b`` or, where ``c`` is a module, ``a.b.c``. A relative import
    is resolved against the file's package."""
    package = list(path.relative_to(root).with_suffix("").parts[:-1])
    found: list[tuple[int, tuple[str, ...]]] = []
    for node in walked(path):
        if isinstance(node, ast.Import):
            found += [(node.lineno, (alias.name,)) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *(node.module.split(".") if node.module else [])])
            found += [(node.lineno, (module, f"{module}.{alias.name}")) for alias in node.names]
    return found


def app_tests_of(module: str) -> str | None:
    """The app whose tests ``module`` is (``failover.tests.exits`` → ``failover``), else None."""
    parts = module.split(".")
    return parts[0] if parts[0] in LAYERS and len(parts) > 1 and parts[1] == "tests" else None


def is_fixture_module(module: str) -> bool:
    return any(module == old or module.startswith(f"{old}.") for old in TEST_FIXTURE_MODULES)


def wrong_test_imports(files: list[Path], root: Path = ROOT) -> list[str]:
    """Imports of a higher app's tests (or any app's, from test code outside the floors), and of
    ``console.testing``."""
    found = []
    for path in files:
        where = path.relative_to(root)
        home = where.parts[0]
        allowed = LAYERS[: LAYERS.index(home) + 1] if home in LAYERS and where.parts[1] == "tests" else []
        for line, names in imported_modules(path, root):
            for module in names:
                if is_fixture_module(module):
                    found.append(f"{where}:{line} imports {module} (the harness holds the shared fixtures)")
                    break
                app = app_tests_of(module)
                if app is not None and app not in allowed:
                    found.append(f"{where}:{line} imports {module}, the tests of an app above it")
                    break
    return sorted(set(found))


def product_imports_of_test_code(files: list[Path], root: Path = ROOT) -> list[str]:
    found = []
    for path in files:
        for line, names in imported_modules(path, root):
            if names[0].split(".")[0] in TEST_ONLY_PACKAGES:
                found.append(f"{path.relative_to(root)}:{line} imports {names[0]}")
    return sorted(set(found))


def files_of_test_code(root: Path = ROOT) -> list[Path]:
    folders = [root / app / "tests" for app in LAYERS] + [root / folder for folder in OUTSIDE_THE_FLOORS]
    return sorted(p for folder in folders for p in folder.rglob("*.py"))


def product_packages(root: Path = ROOT) -> list[Path]:
    """What ``pyproject.toml`` installs (``console*`` → ``console``), and the client's package."""
    config = tomllib.loads((root / "pyproject.toml").read_text())
    names = [pattern.rstrip("*") for pattern in config["tool"]["setuptools"]["packages"]["find"]["include"]]
    return [root / name for name in names] + [root / "client" / "satrain"]


def product_files(root: Path = ROOT) -> list[Path]:
    return sorted(p for package in product_packages(root) for p in package.rglob("*.py") if not {"tests", "migrations"} & set(p.relative_to(root).parts))


def test_no_apps_tests_import_a_higher_apps_tests_or_console_testing():
    assert wrong_test_imports(files_of_test_code()) == []


def test_no_product_module_imports_the_harness_or_pytest():
    assert product_files(), "no product module found: the check would pass on nothing"
    assert product_imports_of_test_code(product_files()) == []


def test_the_harness_is_no_product_package():
    assert "harness" not in [p.name for p in product_packages()]
    assert not (ROOT / "console" / "testing.py").exists()


def test_the_checks_catch_a_bad_import(tmp_path):
    (tmp_path / "jobs" / "tests").mkdir(parents=True)
    (tmp_path / "logs" / "tests").mkdir(parents=True)
    (tmp_path / "jobs" / "tests" / "test_x.py").write_text(
        "from console.tests.browser import login\nfrom console.testing import job_output\nfrom console import testing\n\ndef test_a():\n    from failover.tests import exits\n"
    )
    (tmp_path / "logs" / "tests" / "test_y.py").write_text("from jobs.tests.helpers import make\nfrom logs.tests import other\nfrom . import sibling\n")
    (tmp_path / "jobs" / "views.py").write_text("import pytest\nfrom harness.browser import login\n")
    found = wrong_test_imports(sorted(tmp_path.rglob("test_*.py")), root=tmp_path)
    assert found == [
        "jobs/tests/test_x.py:1 imports console.tests.browser, the tests of an app above it",
        "jobs/tests/test_x.py:2 imports console.testing (the harness holds the shared fixtures)",
        "jobs/tests/test_x.py:3 imports console.testing (the harness holds the shared fixtures)",
        "jobs/tests/test_x.py:6 imports failover.tests, the tests of an app above it",
    ]
    assert product_imports_of_test_code([tmp_path / "jobs" / "views.py"], root=tmp_path) == [
        "jobs/views.py:1 imports pytest",
        "jobs/views.py:2 imports harness.browser",
    ]
