"""The journal: every paid task on disk, from before its request leaves until its results are
saved (DESIGN 19, 22). It sits below the clients, which write it, and below the tracker, which
collects what it holds; its public face is :mod:`imggw_client.tracking`.

- ``journal``: the :class:`Journal` (one SQLite file, shared by processes) and its writes.
- ``schema``: its one table, how older formats are brought forward, whose rows are whose.
- ``moves``: an event's move on its rows, by the one state table (``_core/states.py``).
- ``rows``: a row read back, checked value by value.
- ``lease``: which live process works on a row.
- ``private``: its folder and files are its user's alone.
"""
