"""Kernels that only a chapter runs: steps of the ladder that the library's ops have replaced.

The pages include them and the tests check them; no public op launches them."""
