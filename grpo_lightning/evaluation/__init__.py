"""Validation and test, metrics of sampled completions, completion tables and health checks."""
