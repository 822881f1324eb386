"""The verbs of ``dancegrpo-npu``, one module each: ``register`` adds the verb's sub-parser and
``run`` turns its arguments into calls of the plain functions in the other packages (``engine``,
``rebase``, ``run``, ``rundirs``, ``align``, ``doctor``, ``smoke``, ``throughput``).  ``cli``
lists these modules; each keeps heavy imports (torch, diffusers) inside functions.
"""
