"""What every wing may use: strategies, dtypes, argument types, compute and FLOPs, time budgets,
optimization, step metrics and phase timers, checkpoint files. It imports no wing above it."""
