"""Reading run directories back: what a run left (``rundir``: summary, launch, environment,
metrics), its alignment records (``records``), the table of runs (``listing``) and the plot
(``plot``).  Nothing here writes a run directory; ``run`` (launch, smoke) and the bench do.
"""
