"""The engine: upstream at the locked commit, the series and overlay applied atomically.

``lock`` and ``series`` are the data (upstream.lock, patches/series); ``fetch``,
``apply``, ``status`` (and verify), ``series`` and ``lockfile`` are the verbs; ``stage``
builds the patched files in memory from ``diffs``; ``worktree`` keeps the journal that
makes a swap atomic; ``edits`` finds and saves the user's local edits;
``rebase_state`` is a rebase in progress as the engine verbs must respect it.
"""
