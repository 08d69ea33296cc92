"""A batch beyond one process: shards (contiguous ranges of lines) cut from one input, run
anywhere into one folder (a local path or an fsspec URL), read back and merged, and run all at
once on Dask. Its public names are :mod:`imggw_client.batch`'s; nothing is imported here, so
Dask loads only when the Dask engine is used.
"""
