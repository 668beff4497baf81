"""The backend clock estimate (`clock`, SPEC §4); the heartbeat table and process of SPEC §6 come
with their issue."""
