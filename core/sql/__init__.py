"""Shared SQL building blocks for runstore's SQL backends (and third-party ones).

- `runstore.sql.engine`: `shared_engine(url, options)`, one configured SQLAlchemy
  async engine per database, shared by the savers and event stores opened together.
- `runstore.sql.migrations`: `ensure_schema(conn_or_engine, component, migrations)`.
- `runstore.sql.schema` / `runstore.sql.events`: the run event store
  (`SqlEventStore`) served by the sqlite and postgres plugins.

Submodules are imported on demand so ``import runstore`` stays cheap.
"""
