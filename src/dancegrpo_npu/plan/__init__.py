"""The memory plan: what a rank needs for a GRPO run, from shapes (``dancegrpo-npu plan``)."""
