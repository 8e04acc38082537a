"""The drafter, the frozen target and what runs them: layers, masks, kernels, packing, files on disk."""
