"""``python -m benchmarks.learning``: see :mod:`benchmarks.learning.cli`."""

from benchmarks.learning.cli import main

main()
