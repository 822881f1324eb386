"""Moving the series onto another upstream commit, and leaving it.

``command`` is the ``rebase`` verb (start, --continue, --skip, --abort); ``steps`` moves
one patch; ``queue`` turns the series into commits and back; ``merge`` is the 3-way
fallback; ``finish`` regenerates, verifies and swaps in the new series; ``report`` says
what stopped and why; ``dry_run`` rehearses it all in a scratch clone; ``export`` and
``upstream_log`` are the verbs around it.
"""
