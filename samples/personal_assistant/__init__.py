"""The personal-assistant sample: one `@agent` with the full harness, on the scripted demo model."""
