"""The suite's own helpers, where a mistake would hide lost coverage: skip_or_fail, and the
units conftest.py gives the two workers."""
import os

import pytest

import conftest
from helpers import ROOT, skip_or_fail


def test_a_system_test_skips_in_a_users_clone_and_fails_in_ci(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("REQUIRE_SYSTEM_TESTS", raising=False)
    with pytest.raises(pytest.skip.Exception, match="^needs root here$"):
        skip_or_fail("needs root here")
    for name, value in (("CI", "true"), ("REQUIRE_SYSTEM_TESTS", "1")):  # CI's, and .ci/run's
        with monkeypatch.context() as m:
            m.setenv(name, value)
            with pytest.raises(pytest.fail.Exception, match="^needs root here; CI runs every test"):
                skip_or_fail("needs root here")


def test_the_workers_units_name_modules_that_exist():
    """A module renamed without conftest.py would run on both workers at once, beside itself."""
    tests = {f.removesuffix(".py") for f in os.listdir(os.path.join(ROOT, "tests")) if f.startswith("test_")}
    assert set(conftest.ONE_WORKER) | conftest.ALONE <= tests
    hosts = [f"tests/{m}.py::test_x[a::b]" for m in ("test_multihost", "test_slurm", "test_container")]
    assert {conftest.unit_of(n) for n in hosts} == {"hosts"}
    assert conftest.unit_of("tests/test_main.py::test_y") == "tests/test_main.py::test_y"
