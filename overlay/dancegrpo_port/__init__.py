"""The port's own modules, added into the patched upstream tree beside ``fastvideo/``.

Everything under ``dancegrpo_port/`` is the port's; everything else in the tree is
upstream's, as patched by ``patches/series``.  The trainers reach these modules through the
calls the series adds.  Nothing here imports the ``dancegrpo_npu`` tool: the patched tree
runs on its own (it can be copied to a cluster alone).
"""
