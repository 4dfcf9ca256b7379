import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "faults: the seeded fault test (worker processes, injected faults; ~70 s): "
                   "select with -m faults, skip with -m 'not faults'")
