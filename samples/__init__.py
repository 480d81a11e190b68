"""Runnable samples (`python -m samples.personal_assistant`)."""
