"""Deterministic synthetic data generators (Nexmark auctions) for demos, tests and benchmarks."""
