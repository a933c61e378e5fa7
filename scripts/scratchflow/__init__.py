"""scratchflow: the HPC experiment lifecycle (tar, stage, train, predict, sync back, clean up).

The Snakemake rules only declare files and resources; everything they run lives in this package as
plain functions, so that tests and other tools can call them directly.
"""
