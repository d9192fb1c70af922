"""Measuring: specframe bench, traces and replay (the conformance kit's replay included), sweeps."""
