"""Prompt sampling: tag normalisation and InsTag complexity-first diverse selection."""
