"""parity: cross-checks and benchmarks of paged MLA decode across the torch and JAX stacks (`python -m parity`)."""
