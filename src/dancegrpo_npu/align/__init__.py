"""Alignment: ``compare`` of two recorded runs, with its tolerances (``tolerances``), metrics
(``metrics``, ``modules``) and report (``report``).  The trainer side (the overlay) writes what
the alignment contract says; ``rundirs.records`` reads it, and ``run.align_flags`` turns the
``launch``/``smoke`` flags into trainer arguments.  Heavy imports (numpy, safetensors,
matplotlib) stay inside functions.
"""
