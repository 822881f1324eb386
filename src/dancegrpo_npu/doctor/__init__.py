"""``dancegrpo-npu doctor``: is this host ready (``checks``: versions, devices, the tree;
``compute``: a matmul and an all-reduce on the chosen device)."""
