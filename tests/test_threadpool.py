"""The thread pool's claiming protocol: every piece of every job runs exactly once, within its
job, while job sizes change from one job to the next and the pool has more threads than the
machine has cores (so workers are descheduled between reading the job word and claiming).
Before the fix in sd_threadpool_run (close the previous generation before rewriting the job),
this failed within ~50,000 runs with 4 threads on 2 cores."""

from __future__ import annotations

import pytest

from specdec import _core


@pytest.mark.parametrize("threads", [2, 3, 4, 8])
def test_every_piece_runs_once_within_its_job(threads):
    _core.threadpool_selftest(threads, 300_000)


def test_bad_arguments():
    with pytest.raises(ValueError, match="threads"):
        _core.threadpool_selftest(0, 10)
