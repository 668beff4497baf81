"""The backend clock estimate (`clock`); the heartbeat table and the process that beats it
(`beat`, `loop`)."""
