"""GPU preflight: checks a node's GPUs through NVML (pynvml) and prints a JSON verdict.

Runnable on its own, as the command of a preflight pod::

    python -m preflight check --expect-gpus 8

Exit 0: every check passed; 1: the node failed (the verdict's ``reasons``
say why, one per failed check); 4: the checks could not run (no NVML
library, driver/library mismatch, driver not loaded, a fault file the mock
library cannot parse, bad arguments) -- one line on stderr.

Depends on the standard library and ``nvidia-ml-py`` only (``import
pynvml``), so a preflight image needs nothing else from this repository.
``clusterproof/preflight/checker/mocknvml`` is the project's own ``libnvidia-ml.so.1`` for
machines without GPUs (CI): real pynvml calls, answered from go-nvml's mock
DGX machines with injected faults.
"""
