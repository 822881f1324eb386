"""Part of the FAKE torch_npu used by the tests (see torch_npu/__init__.py)."""
