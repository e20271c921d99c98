"""People's views of the service: offline API docs and the swarm browser UI (SPEC §13)."""
