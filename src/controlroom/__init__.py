"""Controlroom: see what failed in a message-driven system, and act on it."""

__version__ = "0.1.0"
