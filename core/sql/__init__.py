"""Dialect-neutral SQL building blocks for runstore's SQL backends (and third-party ones).

- `runstore.sql.dialect`: `SqlDialect`, what the shared code needs from a database
  beyond SQLAlchemy, bound to each engine by the plugin that opens it.
- `runstore.sql.migrations`: `ensure_schema(conn_or_engine, component, migrations)`.
- `runstore.events.schema`: the run events table, its indexes and `events_migrations`.
- `runstore.events.sql`: `SqlEventStore`, the event store contract on any engine,
  and `SqlEventDriver`, the interface each dialect implements to run its SQL.

The drivers and engine openers live in the plugins (`runstore.plugins.sqlite`,
`runstore.plugins.postgres`); nothing here imports a plugin. Submodules are imported
on demand so ``import runstore`` stays cheap.
"""
