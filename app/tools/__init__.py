"""Tools for sub-agents over MCP (SPEC §9): servers, sessions, limits and the call."""
