"""git, as the engine and the rebase call it: plumbing (``gitutil``) and a repository (``gitcmd``)."""
