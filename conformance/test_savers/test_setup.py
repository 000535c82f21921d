"""The saver contract before ``setup()``: a saver opened without its migrations (as
``from_conn_string`` opens one) either works or says to call ``setup()``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from runstore.errors import SchemaNotSetUpError
from runstore.options import BackendOptions

from ..harness import Provisioned
from ..savers_model import config_for, make_checkpoint, named, new_checkpoint_id, new_thread_id

CONTRACT = (
    "contract: a saver opened without its migrations (from_conn_string without setup()) works, "
    "or raises runstore.errors.SchemaNotSetUpError naming setup() with the driver's error as __cause__"
)


def test_unset_up_saver_says_to_call_setup(saver_target: Any) -> None:
    """On a fresh storage opened without migrations, reads and writes work or raise
    `SchemaNotSetUpError` (message naming ``setup()``, driver error as ``__cause__``);
    after ``setup()`` (where the saver has one) they work."""

    async def call(saver: Any, what: str, op: Any) -> bool:
        try:
            await op()
        except SchemaNotSetUpError as exc:
            assert "setup()" in str(exc) and exc.__cause__ is not None, named(f"{what}: {exc!r} ({CONTRACT})")
            return False
        except Exception as exc:
            pytest.fail(named(f"{what} raised {type(exc).__module__}.{type(exc).__name__}: {exc} ({CONTRACT})"))
        return True

    async def main(url: Any) -> None:
        async with BackendOptions.scope(saver_target.settings) as options:
            options.migrate = False
            saver = await saver_target.spec.open(url, options)
            thread = new_thread_id("unset")
            cid = new_checkpoint_id()
            version = saver.get_next_version(None, None)

            async def put() -> None:
                await saver.aput(
                    config_for(thread), make_checkpoint(cid, {"a": 1}, {"a": version}),
                    {"source": "input", "step": -1}, {"a": version},
                )

            async def get() -> None:
                await saver.aget_tuple(config_for(thread))

            worked = [await call(saver, "aget_tuple", get), await call(saver, "aput", put)]
            setup = getattr(saver, "setup", None)
            if all(worked) or setup is None:
                return
            await setup()
            await put()
            got = await saver.aget_tuple(config_for(thread))
            assert got is not None and got.checkpoint["id"] == cid, "contract: after setup() the saver works"
            await saver.adelete_thread(thread)

    with Provisioned(saver_target.named_url) as fresh:
        asyncio.run(main(fresh.url))
