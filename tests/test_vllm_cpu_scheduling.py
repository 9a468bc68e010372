"""vLLM 0.32's CPU platform runs every server synchronously, whatever the flags say.

`CpuPlatform.check_and_update_config` sets `scheduler_config.async_scheduling = False`
unconditionally ("async scheduling is not required on CPU"), after the check that turns it off
for speculative methods. So on this CPU `off` (no speculation) and `off-sync` (no speculation,
`--no-async-scheduling`) are the same server, and a treespec server is scheduled like both:
the benchmarks' `off-sync` column is an A/A control of their noise there, not the cost of
synchronous scheduling (docs/never-slower.md, "The scheduling mode on CPU"). If a vLLM bump
changes this, these tests fail and that column means something else again.
"""
from __future__ import annotations

import pytest


@pytest.mark.parametrize("flag", [None, True, False])
def test_cpu_platform_schedules_synchronously(tiny_model, flag):
    from vllm.engine.arg_utils import EngineArgs

    config = EngineArgs(model=str(tiny_model), async_scheduling=flag).create_engine_config()
    assert config.scheduler_config.async_scheduling is False
    assert config.scheduler_config.get_scheduler_cls().__name__ == "Scheduler"
