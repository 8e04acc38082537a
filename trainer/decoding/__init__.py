"""Speculative decoding (chains, trees, batches, linear-state rollback) and its evaluation."""
