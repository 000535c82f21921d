"""Run event store conformance: the contract of docs/events.md, one module per area.

Every test takes ``events_target`` and is synchronous. Assertion messages start with
``contract:`` and name the rule a backend broke.

The areas: put and put_batch, seqs and what a record holds (`test_append`),
put_if_absent under races (`test_put_if_absent`), listing, paging and cursors
(`test_paging`), message lookups and counts (`test_messages`), owners (`test_owner`),
deletes (`test_deletion`), bad input (`test_validation`) and the state machine
(`test_state_machine`; the machine itself is
`runstore.conformance.machines.EventStoreMachine`). The model and worker helpers
live in ``events_model`` and ``events_workers``.

The package is one suite: ``-k test_events``, ``--pyargs runstore.conformance.test_events``,
`runstore check`'s ``events`` column and the broken-backend runner select all of it, and
``from runstore.conformance.test_events import *`` brings every event store test into a
module (as the tests `runstore new-plugin` writes do).
"""

from .test_append import *  # noqa: F403
from .test_deletion import *  # noqa: F403
from .test_messages import *  # noqa: F403
from .test_owner import *  # noqa: F403
from .test_paging import *  # noqa: F403
from .test_prefix_ids import *  # noqa: F403
from .test_put_if_absent import *  # noqa: F403
from .test_state_machine import *  # noqa: F403
from .test_validation import *  # noqa: F403
