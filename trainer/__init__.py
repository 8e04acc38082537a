"""The DFlash drafter trainer. Runs inside the container; imports nothing from orchestrator or tui."""
