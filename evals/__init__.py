"""Evals: benchmark loaders, scorers shared with training, harness and reports."""
