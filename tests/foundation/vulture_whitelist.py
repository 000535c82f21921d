"""Names the dead-code check (vulture, tests/foundation/test_lint.py) cannot see used.

Each line names a use that happens by reflection, by a framework, or by a public API that
applications call; a name added here says why.
"""

# ruff: noqa: B018, F821
# A signal handler's signature is fixed by the signal module.
signum
# importlib calls a loader's create_module.
create_module
# SQLAlchemy calls event listeners registered with @event.listens_for.
_on_checkout
_on_checkin
_on_connect
_on_begin
# TypedDict and settings dataclass fields are read by key or through dataclasses.fields.
lease_expires_at
cancel_action
cancel_requested_at
application_name
connect_timeout_seconds
command_timeout_seconds
operation_timeout_seconds
socket_connect_timeout_seconds
socket_timeout_seconds
health_check_interval_seconds
# Bench rows are written to JSONL field by field (NamedTuple._asdict).
order_in_cell
estimated_full_bytes
# Public API an application calls (docs/runs.md, docs/checkpoint-modes.md, the owner scope's type).
run_graph
check_thread_mode
AutoType
# Spawned worker processes import this by name (runstore.conformance.processes).
load_plugins_from_env
# The Agent Server tests' graph, found by the path in langgraph.json.
graph
# LangGraph reads these attributes of a BaseStore (runstore.store.base.StoreBase sets them).
supports_ttl
index_config
# LangGraph's stock AsyncSqliteSaver reads it (runstore.migrate.endpoints: a read-only source).
is_setup
