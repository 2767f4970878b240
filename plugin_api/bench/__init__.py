"""``plugin-api bench``: op benchmarks beside ceilings and baselines measured in the same run.

Modules: ``harness`` (timing, statistics, cache eviction), ``ceilings`` (copy bandwidth, matmul
rate, roofline), ``cases`` (named cases with model shapes; bytes and FLOPs), ``workloads``
(tensors and calls per case), ``baselines`` (plain torch for the same problems), ``run`` (one run),
``report`` (table, JSON, doctor summary), ``plot`` (roofline PNG), ``cli`` (the verb).
"""
