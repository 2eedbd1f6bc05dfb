"""Triton kernels of the fast decode step: attention, the q/k/v step and token sampling."""
