"""The ``runstore`` command: backends, check, schema-sql, retention, new-plugin, bench.

``main`` holds the click group; ``check`` runs the conformance suite, ``retention`` the
sweeper commands, ``scaffold`` writes a plugin project, ``console`` the terminal output.
Runtime modules never import this package.
"""

from __future__ import annotations

from runstore.cli.main import main, run

__all__ = ["main", "run"]
