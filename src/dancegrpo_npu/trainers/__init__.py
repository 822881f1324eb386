"""The families of models the tool knows, one folder each (``trainers/<family>/``): its registry
rows, smoke hooks, fixtures and tiny models, architecture, plan shapes, bench configs and numerics
block.  Nothing here lists them: the registry (dancegrpo_npu.registry) finds every folder by
walking this package, so a folder copied here under a new name is a new family.
"""
