"""@rate_limited Celery tasks on the in-process threads worker: a task over its budget retries
with the countdown until a permit (``on_busy="retry"``) or is skipped."""

from __future__ import annotations

import pytest

from tests.celery.conftest import entries

pytestmark = pytest.mark.usefixtures("threads_worker")


def test_over_budget_task_retries_after_the_countdown(locks, log):
    from tests.celery.rate_tasks import rate_retry

    results = [rate_retry.delay("a") for _ in range(3)]
    retries = sorted(r.get(timeout=60) for r in results)
    assert retries[0] == 0 and retries[-1] >= 1  # the later ones were retried
    runs = sorted(float(e[1]) for e in entries(log, "ran", "a"))
    assert len(runs) == 3
    # One per 2 s on the server's clock (read in the body, a little after each grant: the
    # exact spacing is the engine tests'), retried with the countdown, not spinning: each retry
    # waited for its permit (the wait rounded up, so at most ~1 s past it).
    assert all(b - a > 1.5 for a, b in zip(runs, runs[1:], strict=False))
    assert runs[-1] - runs[0] < 2 * 2.0 + 6.0
    assert sum(retries) <= 6
    assert locks.hget("ct:rlock:rr:a", "rate") == b"1"


def test_over_budget_task_is_skipped(locks, log):
    from tests.celery.rate_tasks import rate_default, rate_skip

    assert [rate_skip.delay("s").get(timeout=30) for _ in range(3)] == ["ran", "ran", None]
    assert len(entries(log, "ran", "s")) == 2
    # An unbound task without on_busy: skipped too (@locked's default for tasks), logged.
    assert [rate_default.delay("d").get(timeout=30) for _ in range(2)] == ["ran", None]
    assert len(entries(log, "ran", "d")) == 1


def test_a_rate_lowered_below_the_permits_skips_the_task_instead_of_failing_it(locks, log):
    """An operator's set_rate below the task's permits: the task is skipped as over budget
    (not failed with RateLimiterError), until the rate is raised again."""
    from django_rlock.engine.ratelimit import RateLimiter
    from tests.celery.rate_tasks import rate_bulk

    assert rate_bulk.delay("b").get(timeout=30) == "ran"
    limiter = RateLimiter(locks, "ct:rlock:rb:b")
    limiter.set_rate(2, 60)
    result = rate_bulk.delay("b")
    assert result.get(timeout=30) is None and result.state == "SUCCESS"
    assert len(entries(log, "ran", "b")) == 1
    limiter.set_rate(10, 60)
    assert rate_bulk.delay("b").get(timeout=30) == "ran"
