"""The training step and what runs it: the module, its option groups, schedules, budgets and strategies."""
