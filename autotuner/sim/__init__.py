"""A simulated `vllm serve` on GPUs this machine does not have.

Kept import-light: the simulated TP worker processes import this package.
"""
