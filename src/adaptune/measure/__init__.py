"""Measuring candidates: build (``build``) and run (``run``) kernels in worker processes, check
their output (``verify``), time them alternately and paired (``paired``), the hardware target
(``target``) and the records kept of it all (``records``).  Kept free of imports so builder
workers stay fast to start."""
