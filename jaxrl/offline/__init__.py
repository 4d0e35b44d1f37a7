"""Offline datasets and agents (see the offline-RL issue)."""
