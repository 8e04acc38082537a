"""The training run's parts: objective, optimizer, ranks, metrics, start-up, tau, checkpoints."""
