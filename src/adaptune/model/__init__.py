"""Whole models: loading (``frontends``, ``zoo``, ``workloads``), the Relax graph passes
(``graph``), the vendor library path (``library``, ``winograd``), compiling and checking the tuned
model (``compile``), and the tables that compare it (``evaluate``, ``report``)."""
