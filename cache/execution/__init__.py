"""Running plans: the plan cache and the I/O planning needs (`planning`), the executor of a
guard decision (`execute`) and the provenance of its result (`provenance`)."""
