"""The personal-assistant sample: a `@coordinator` with a fleet, and an opted-in `ai_endpoint`."""
