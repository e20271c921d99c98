"""The built-in OpenAI-compatible simulated gateway (SPEC §6): deterministic answers and faults.

`config` (SimulatorConfig, `SWARM_SIM_*`, the stats), `directives` (the request and its
`[[sim …]]` directives), `responses` (the answers), `tools` (tool-calling turns), `app` (the
ASGI app and its server)."""

from __future__ import annotations

from app.simulator.app import MODELS, create_simulator, run_simulator
from app.simulator.config import MAX_KEYS, SimulatorConfig, SimulatorStats
from app.simulator.responses import PLAN_HINTS

__all__ = ["MAX_KEYS", "MODELS", "PLAN_HINTS", "SimulatorConfig", "SimulatorStats",
           "create_simulator", "run_simulator"]
