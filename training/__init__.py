"""Training: trajectories, rollout collection, rewards, Flow-GRPO batches and the trainer."""
