"""The one validation of a run's config, before anything is built: the key checks that need the
models, the optimizer or the devices (config/ itself imports nothing above it)."""
