"""The coding-agent sample: files, grep, edits, tool-output offload and a routed memory store."""
