"""``dancegrpo-npu smoke``: a short GRPO run of the patched trainers on tiny models
(``tiny_models``) saved as fixtures (``fixtures``) through the real loading paths."""
