"""Facts about this host that ``launch`` and ``doctor`` both use, read without importing torch:
the Ascend environment, CANN and driver, the NPUs there are (``ascend``), the network
interfaces and ports (``network``), the CPU cores a job's processes share (``cpus``), and the
devices, drivers and package versions a job will see (``devices``).
"""
