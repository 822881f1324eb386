"""``dancegrpo-npu bench``: rollout and GRPO-step throughput of FLUX.1-dev's architecture."""
