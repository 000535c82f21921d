"""Moving data between backends: `runstore migrate`, `runstore export` and `runstore import`.

The wing reads every kind through its public protocol (plus the ``bulk_import``
capability where a backend declares it), streams records (`runstore.migrate.records`)
and writes them with insert-if-absent semantics, so an interrupted copy continues and a
finished one copies nothing (docs/migrate.md).
"""
