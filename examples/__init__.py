"""Runnable examples built on the packages (not installed: run them from the repository root)."""
