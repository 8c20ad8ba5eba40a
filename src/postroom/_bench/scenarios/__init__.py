"""One module per scenario; each ``run(ctx)`` returns its ``Measurement`` rows."""
