"""A profiler (Kineto) trace read, costed and phased: pure, numpy-free, no device needed.

``events`` reads and joins a trace (``stream`` past 256 MB); ``cost`` costs an op by the rule that
matches its name (``registry``: ``@rule``, ``load_rules``; ``rules/``: one file per ecosystem;
``opcost``: what a rule reads and returns); ``graphs`` maps graph replays and names kernels;
``phases`` splits prefill / decode / forward; ``analyze`` turns one trace into result records
(``analyze_trace``); ``idle``, ``comms``, ``experts`` and ``device`` add GPU idle causes,
collectives, tokens per expert and the traced GPU.
"""
