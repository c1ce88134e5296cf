"""The demo: the main job end to end on local servers (``python -m zcluster.demo`` or ``./run demo``).

The code is in :mod:`zcluster.demo.__main__`; importing this package starts nothing and imports nothing.
"""
