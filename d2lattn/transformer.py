"""Placeholder: being written (see the open issue for this chapter)."""

__all__: list[str] = []
