"""The training step and what runs it: the module, its update loop, option groups and settings, schedules and callbacks."""
