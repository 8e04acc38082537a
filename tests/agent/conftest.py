from __future__ import annotations

from tests.agent.pidns import (agent_pyz, bad_init_container, container, fresh_bad_init_container,  # noqa: F401
                                 runs_dir)
