"""dancegrpo-npu: run upstream DanceGRPO on Ascend NPUs (and CUDA, and CPU) from a
pinned upstream commit, an ordered patch series and an overlay of added modules."""

__version__ = "0.1.0"
