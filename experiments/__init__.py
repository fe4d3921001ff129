"""The book's experiments: one module per sweep, run by ``python -m experiments`` (README.md)."""
