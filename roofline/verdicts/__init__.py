"""Verdicts: what result files say, as findings (pure).

* ``findings``       the registry: the ``Finding`` type, ``@finding`` / ``register`` and ``run`` (rules run by
                     scope, in ascending order).
* ``diagnosis``      the consumer: ``diagnose(result_files)`` and ``change_findings(comparison)``.
* rule modules, each registering its findings: ``latency_rules``, ``phase_rules``, ``expert_rules``,
  ``trace_rules``, ``counter_rules``, ``change_rules``; ``advice`` holds the device-dependent actions.
* before and after: ``change`` (one number and its noise rule), ``comparison`` (two files matched point by
  point), ``latency_change`` (latency percentiles), ``compare_file`` (compare.json).
* ``counters_join``  Nsight Compute launches joined with the cost model's workload points.
"""
