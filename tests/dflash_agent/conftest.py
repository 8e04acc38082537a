from __future__ import annotations

from tests.dflash_agent.pidns import (agent_pyz, bad_init_container, container,  # noqa: F401
                                            fresh_bad_init_container, runs_dir)
