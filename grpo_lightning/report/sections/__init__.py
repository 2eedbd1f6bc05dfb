"""The sections of the report, one module each: what each says about a sweep's arms and how it decides it."""
