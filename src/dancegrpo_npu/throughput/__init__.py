"""``dancegrpo-npu bench``: rollout and GRPO-step throughput of the registry's trainers."""
