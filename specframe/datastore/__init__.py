"""Retrieval datastores: a corpus's token ids and their suffix array, searched by binary search.

Used by the ``retrieval`` proposer (REST, He et al. 2024). Build one with ``specframe datastore build``
(:mod:`specframe.datastore.command`) or :func:`build_datastore`; open it with :meth:`Datastore.open`. The format
is described in :mod:`specframe.datastore.store`; docs/retrieval.md has the walkthrough.
"""

from .store import FORMAT, SEPARATOR, VERSION, Datastore, DatastoreError, Retrieval, build_datastore, is_datastore

__all__ = ["FORMAT", "SEPARATOR", "VERSION", "Datastore", "DatastoreError", "Retrieval", "build_datastore",
           "is_datastore"]
