"""Tests in a real browser (a package, so its modules share conftest.py's helpers)."""
