"""The lab's run lifecycle again on real, unprivileged LXC containers (tests/lab/lxclab.py): the same test bodies
as test_lab_lifecycle.py with `lab` the LXC lab (launch, ps, logs, kill of a family that fights back, cleanup under
a PID 1 that never reaps, reboot), and what only a real container shows: a supervisor OOM-killed by the memory
cgroup, /dev/shm gone after a reboot, pct exec's two environment modes."""
from __future__ import annotations

import pytest

from tests.on_lab import test_lab_lifecycle as lifecycle
from tests.on_lab.test_lab_lifecycle import inv  # noqa: F401  (its inventory fixture, here of the LXC lab)

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def lab(lxc_lab):
    return lxc_lab


test_launch_ps_logs_kill_on_lxc = lifecycle.test_launch_returns_verified_and_the_run_outlives_ssh_and_pct
test_kill_of_a_family_that_fights_back_on_lxc = lifecycle.test_kill_leaves_nothing_of_a_family_that_fights_back
test_cleanup_under_a_non_reaping_pid1_on_lxc = \
    lifecycle.test_cleanup_reaps_a_runs_stuck_parent_leaves_a_foreign_one_and_reports_pid1_zombies
test_reboot_mid_run_is_lost_on_lxc = lifecycle.test_container_reboot_mid_run_is_lost
