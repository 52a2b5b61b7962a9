"""One module per CLI command group; ``profiler.cli`` loads them lazily."""
