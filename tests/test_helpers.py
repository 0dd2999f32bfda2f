"""The suite's own helpers, where a mistake would hide lost coverage: skip_or_fail."""
import pytest

from helpers import skip_or_fail


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
