"""The kernel: host, endpoints, runs, the stream, the model/tool loop, the executor and live runs.

Primitives never import it; they see it through `atmosphere_harness._contracts`.
"""
