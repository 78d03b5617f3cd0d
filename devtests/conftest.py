"""Puts devtests/ on sys.path (pytest does so for a conftest's folder), so that the
areas share helpers such as runner_events.py."""
