"""Running the stock upstream scripts: ``launch`` plans (``plan``, ``environment``,
``upstream_args``, ``ascend``) and ``runner`` runs under torchrun into a run directory
(``records``, ``fingerprint``); ``runs`` and ``plot`` read those directories back.
"""
