"""What every wing may use: strategies, dtypes, argument types, compute and FLOPs, time budgets,
optimization, step metrics and phase timers, checkpoint files, the project's cache folder. It
imports no wing above it."""
