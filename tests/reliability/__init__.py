"""The reliability suite: fuzzing, load, faults and a hostile model against a real server."""
