"""The one list of doctor's checks after the basics. Each is a function of the gathered Facts that returns a
Row, a list of Rows, or None where it does not apply; add a check by adding it here."""
from __future__ import annotations

from typing import Callable, Iterable, Union

from . import config, gpu, limits, storage
from .facts import Facts
from .report import Row

Check = Callable[[Facts], Union[Row, list, None]]

GPU_CHECKS: tuple[Check, ...] = (gpu.driver, gpu.device_nodes, gpu.ct_devices, gpu.gpus_unclaimed)
CONTAINER_CHECKS: tuple[Check, ...] = (storage.shm, storage.workdir, limits.limits)
CONFIG_CHECKS: tuple[Check, ...] = (config.missing_paths, config.volatile_paths, config.checkpoint_space,
                                    config.shm_for_run)
CHECKS: tuple[Check, ...] = GPU_CHECKS + CONTAINER_CHECKS + CONFIG_CHECKS
# what `launch --config` runs first (the GPU ones unless the config trains on the CPU; whether the paths exist
# is the trainer's own check's to say): only their fails refuse
PREFLIGHT: tuple[Check, ...] = CONFIG_CHECKS[1:] + (storage.workdir,)
PREFLIGHT_GPU: tuple[Check, ...] = (gpu.driver, gpu.device_nodes, gpu.ct_devices)


def run_checks(facts: Facts, checks: Iterable[Check] = CHECKS) -> list[Row]:
    rows: list[Row] = []
    for check in checks:
        found = check(facts)
        rows.extend(found if isinstance(found, list) else [found] if found is not None else [])
    return rows
