"""Tooling for tests and fault benchmarks: kernels and wrappers that misbehave on purpose."""
