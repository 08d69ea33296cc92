"""The suite's httpx2 lane (.ci/run, DESIGN 23): with this folder on ``PYTHONPATH``, every
Python process of the run (pytest, its workers, each CLI, gateway or Dask process a test
starts) resolves ``import httpx`` to httpx2 before anything imports httpx, as an application
that calls ``httpx2.alias_httpx()`` at start does."""

import httpx2

httpx2.alias_httpx()
