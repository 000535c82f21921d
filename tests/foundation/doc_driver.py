"""Run one page's python blocks in order in one namespace, as a reader pasting them would.

``python doc_driver.py BLOCKS.json RESULTS.json`` (run with the scratch directory as the
working directory). BLOCKS.json is a list of ``{"index", "name", "code"}``; ``name`` (such
as ``docs/store.md:19``) labels the block's tracebacks. A block using top-level ``await``
runs on the run's one event loop, as in ``python -m asyncio`` (so a block may await what
an earlier one opened); any other block runs as a script. Each block's stdout is recorded;
the first failing block stops the run with its traceback.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import inspect
import io
import json
import sys
import traceback


def main(blocks_path: str, results_path: str) -> int:
    with open(blocks_path) as fh:
        blocks = json.load(fh)
    namespace: dict[str, object] = {"__name__": "__main__"}
    results: list[dict[str, object]] = []
    status = 0
    loop = asyncio.new_event_loop()
    for block in blocks:
        out = io.StringIO()
        entry: dict[str, object] = {"index": block["index"], "ok": False}
        try:
            code = compile(block["code"], f"<{block['name']}>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
            with contextlib.redirect_stdout(out):
                if code.co_flags & inspect.CO_COROUTINE:
                    loop.run_until_complete(eval(code, namespace))
                else:
                    exec(code, namespace)
            entry["ok"] = True
        except BaseException:
            entry["error"] = traceback.format_exc()
            status = 1
        entry["stdout"] = out.getvalue()
        results.append(entry)
        if status:
            break
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.close()
    with open(results_path, "w") as fh:
        json.dump(results, fh)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
