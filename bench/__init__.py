"""The benchmark suite: ``python -m bench list | run NAME [--smoke] [-- ARGS] | report`` (bench/__main__.py).

The scripts themselves import their neighbours by plain name (``from common import ...``): the runner starts each in
a process of its own with bench/ as its folder, so they run the same way by hand (``cd bench && python encode.py``).
"""
