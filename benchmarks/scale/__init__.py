"""The 960-rollout scene: sandboxd and the naive docker-run burst, each on an engine of its own."""
