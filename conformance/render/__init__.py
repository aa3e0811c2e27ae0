"""Rendering: the render stage (stage.py) and the result store with its cached runner (store.py)."""
