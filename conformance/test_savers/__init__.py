"""The checkpoint saver contract, as generated tests: one module per contract area.

Every test takes ``saver_target`` (see `runstore.conformance.harness`). Tests that
need an optional capability are marked ``@pytest.mark.requires(...)``. Assertion
messages name the contract that broke.

The areas: put and get_tuple (`test_put_get`), list and its filters (`test_list`),
pending writes (`test_put_writes`), delta history (`test_delta_history`), copy, prune
and delete (`test_copy_prune_delete`), before `setup()` (`test_setup`), the sync twins (`test_sync_api`), reopening,
other processes and threads (`test_durability`), a real graph (`test_graph_parity`)
and the state machine (`test_state_machine`; the machine itself is
`runstore.conformance.machines.SaverMachine`). The model and graph helpers live in
``savers_model``, ``savers_graph``, ``savers_metadata`` and ``savers_checks``.

The package is one suite: ``-k test_savers``, ``--pyargs runstore.conformance.test_savers``,
`runstore check`'s ``savers`` column and the broken-backend runner select all of it, and
``from runstore.conformance.test_savers import *`` brings every saver test into a module
(as the tests `runstore new-plugin` writes do).
"""

from .test_copy_prune_delete import *  # noqa: F403
from .test_delta_history import *  # noqa: F403
from .test_durability import *  # noqa: F403
from .test_graph_parity import *  # noqa: F403
from .test_list import *  # noqa: F403
from .test_prefix_ids import *  # noqa: F403
from .test_put_get import *  # noqa: F403
from .test_put_writes import *  # noqa: F403
from .test_setup import *  # noqa: F403
from .test_state_machine import *  # noqa: F403
from .test_sync_api import *  # noqa: F403
