"""The long-term memory store kind (LangGraph ``BaseStore``): the rules every runstore store
shares, so each backend accepts and refuses the same input and answers the same way.

`StoreBase` is the base class of runstore's stores; `check_ops` checks a batch before any
I/O; `compile_filter`/`matches` are the filter rules; `list_namespaces`, `within` and
`matches_labels` the namespace rules; `TTLRules`/`expiry`/`expired` the TTL arithmetic;
`IndexRules`/`texts_to_embed`/`cosine` semantic search; `plan_batch` cuts an ordered
batch into runs a backend may execute together.
"""

from __future__ import annotations

from runstore.store.base import StoreBase
from runstore.store.filters import (
    OPERATORS,
    Condition,
    compile_filter,
    holds,
    json_equal,
    lookup,
    matches,
)
from runstore.store.indexing import (
    IndexRules,
    check_fields,
    check_index_arg,
    check_vectors,
    cosine,
    texts_to_embed,
)
from runstore.store.inputs import (
    RESERVED_LABEL,
    WILDCARD,
    check_key,
    check_labels,
    check_minutes,
    check_namespace,
    check_page,
    check_value,
)
from runstore.store.ops import (
    Checked,
    Get,
    ListNamespaces,
    Put,
    Search,
    check_op,
    check_ops,
    list_namespaces,
    matches_labels,
    plan_batch,
    within,
)
from runstore.store.ttl import TTLRules, expired, expiry

__all__ = [
    "OPERATORS",
    "RESERVED_LABEL",
    "WILDCARD",
    "Checked",
    "Condition",
    "Get",
    "IndexRules",
    "ListNamespaces",
    "Put",
    "Search",
    "StoreBase",
    "TTLRules",
    "check_fields",
    "check_index_arg",
    "check_key",
    "check_labels",
    "check_minutes",
    "check_namespace",
    "check_op",
    "check_ops",
    "check_page",
    "check_value",
    "check_vectors",
    "compile_filter",
    "cosine",
    "expired",
    "expiry",
    "holds",
    "json_equal",
    "list_namespaces",
    "lookup",
    "matches",
    "matches_labels",
    "plan_batch",
    "texts_to_embed",
    "within",
]
