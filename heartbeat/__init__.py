"""The heartbeat table and the backend clock estimate (SPEC §6)."""
