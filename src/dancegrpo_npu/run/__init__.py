"""Running the stock upstream scripts and writing their run directories: ``launch`` plans
(``plan``, ``recipes``, ``upstream_args``, ``environment``, ``align_flags``) and ``runner`` runs
under torchrun into a new run directory (``directory``, ``fingerprint``, ``failure``).
``rundirs`` reads those directories back.
"""
