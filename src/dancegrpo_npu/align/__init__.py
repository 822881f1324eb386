"""Alignment: the same noise everywhere, recorded stages, replay, and ``compare``.

The trainer side (patches to upstream's Flux trainers) writes what the alignment contract says;
this package reads it: ``options`` turns the ``launch``/``smoke`` flags into trainer arguments
and checks a replay before anything starts; ``records`` reads ``records/``; ``compare`` is the
verb, with its tolerances (``tolerances``), metrics (``metrics``) and report (``report``).
Heavy imports (numpy, safetensors, matplotlib) stay inside functions.
"""
