"""`StoreBase`: LangGraph's ``BaseStore`` with runstore's checks in front of every method.

LangGraph's methods check namespaces with its own ``InvalidNamespaceError`` before a
batch; this base builds the same ops without that, so every bad input (a direct
``abatch`` call too) meets `check_ops` and raises `InvalidStoreInputError`. It holds
what every runstore store shares: the clock, the checked TTL and index configs, and
embedding with the dimension check, and the sync twins of a store bound to an event
loop. A backend implements `abatch` and `asweep_expired`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Literal

from langgraph.store.base import (
    NOT_PROVIDED,
    BaseStore,
    GetOp,
    Item,
    ListNamespacesOp,
    MatchCondition,
    NotProvided,
    PutOp,
    SearchItem,
    SearchOp,
)

from runstore.clock import Clock, check_time, system_clock
from runstore.errors import InvalidStoreInputError
from runstore.options import BackendOptions
from runstore.settings import Settings
from runstore.standalone import Standalone
from runstore.store.indexing import IndexRules, check_vectors
from runstore.store.ttl import TTLRules
from runstore.twins import run_sync
from runstore.urls import BackendURL

if TYPE_CHECKING:
    from typing import Self

#: Where `runstore.open` leaves ``store_index``/``store_ttl`` for a store factory
#: (`BackendOptions.provide`); `store_config` reads it.
STORE_CONFIG_KEY = "runstore.store.config"


def store_config(
    options: Any, index: Mapping[str, Any] | None = None, ttl: Mapping[str, Any] | None = None
) -> tuple[Any, Any]:
    """``(index, ttl)``: the ones given here, else those given to `runstore.open` as
    ``store_index``/``store_ttl`` (``None`` each if neither), as given (LangGraph's
    `IndexConfig`/`TTLConfig` or plain mappings)."""
    config = options.provided(STORE_CONFIG_KEY) or (None, None)
    return (config[0] if index is None else index), (config[1] if ttl is None else ttl)


class StoreBase(Standalone, BaseStore):
    """What every runstore store shares; ``clock`` may be replaced (tests: a `ManualClock`).

    A backend class has ``open(url, options)`` (reading ``index``/``ttl`` with
    `store_config`); `from_conn_string`, `setup` and `schema_sql` come with it.
    """

    supports_ttl = True
    #: The event loop the store was opened on, where its sync twins (`batch`,
    #: `sweep_expired`) run the async methods; ``None`` before opening and once closed.
    #: A store that runs in the caller's thread (memory) overrides the twins instead.
    loop: asyncio.AbstractEventLoop | None = None
    #: The `RuntimeError` a call on a closed store raises.
    closed_message = "this store is closed"

    def __init__(
        self,
        *,
        index: Mapping[str, Any] | None = None,
        ttl: Mapping[str, Any] | None = None,
        clock: Clock = system_clock,
    ) -> None:
        self.ttl_rules = TTLRules.of(ttl)
        self.ttl_config = self.ttl_rules.as_config()  # type: ignore[assignment]
        self.index_rules = IndexRules.of(index)
        self.index_config = self.index_rules.config if self.index_rules else None
        self.clock = clock

    @classmethod
    @asynccontextmanager
    async def from_conn_string(
        cls,
        url: str | BackendURL,
        config: Mapping[str, Any] | str | os.PathLike[str] | Settings | None = None,
        *,
        index: Mapping[str, Any] | None = None,
        ttl: Mapping[str, Any] | None = None,
    ) -> AsyncIterator[Self]:
        """Open the store on ``url`` on its own, as LangGraph's ``from_conn_string(url,
        index=, ttl=)`` does; close it on exit. No migrations run: call `setup`."""
        if isinstance(url, str) and "://" not in url and cls.file_scheme is not None:
            url = BackendURL.for_file(cls.file_scheme, url)
        async with BackendOptions.scope(Settings.load(config)) as options:
            options.migrate = False
            options.provide(STORE_CONFIG_KEY, (index, ttl))
            yield await cls._open_standalone(BackendURL.parse(url), options)

    def now(self) -> Any:
        """The store's current time (an aware datetime), read once per batch."""
        return check_time(self.clock(), "the store's clock()")

    # -- embedding -------------------------------------------------------------------

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        """Vectors for ``texts``, each checked against the index's ``dims``."""
        rules = self._rules()
        return check_vectors(rules.embeddings.embed_documents(list(texts)) if texts else [], len(texts), rules.dims)

    async def aembed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        """`embed_documents` through the embeddings' async method."""
        rules = self._rules()
        vectors = await rules.embeddings.aembed_documents(list(texts)) if texts else []
        return check_vectors(vectors, len(texts), rules.dims)

    def embed_query(self, query: str) -> list[float]:
        """The vector of a search query, checked like a document's."""
        rules = self._rules()
        return check_vectors([rules.embeddings.embed_query(query)], 1, rules.dims)[0]

    async def aembed_query(self, query: str) -> list[float]:
        """`embed_query` through the embeddings' async method."""
        rules = self._rules()
        return check_vectors([await rules.embeddings.aembed_query(query)], 1, rules.dims)[0]

    def _rules(self) -> IndexRules:
        if self.index_rules is None:
            raise InvalidStoreInputError("this store has no index config; open it with index={'dims', 'embed'}")
        return self.index_rules

    # -- LangGraph's methods, without its own namespace check -------------------------

    def _refresh(self, refresh_ttl: bool | None) -> bool:
        return self.ttl_rules.refresh_on_read if refresh_ttl is None else refresh_ttl

    def _ttl(self, ttl: float | NotProvided | None) -> float | None:
        return self.ttl_rules.default_ttl if isinstance(ttl, NotProvided) else ttl

    @staticmethod
    def _listing(
        prefix: Any, suffix: Any, max_depth: int | None, limit: int, offset: int
    ) -> ListNamespacesOp:
        conditions = []
        if prefix:
            conditions.append(MatchCondition(match_type="prefix", path=prefix))
        if suffix:
            conditions.append(MatchCondition(match_type="suffix", path=suffix))
        return ListNamespacesOp(tuple(conditions), max_depth, limit, offset)

    def get(self, namespace: tuple[str, ...], key: str, *, refresh_ttl: bool | None = None) -> Item | None:
        """The item at ``namespace``/``key``, or ``None``."""
        return self.batch([GetOp(namespace, key, self._refresh(refresh_ttl))])[0]

    async def aget(self, namespace: tuple[str, ...], key: str, *, refresh_ttl: bool | None = None) -> Item | None:
        """The item at ``namespace``/``key``, or ``None``."""
        return (await self.abatch([GetOp(namespace, key, self._refresh(refresh_ttl))]))[0]

    def search(
        self,
        namespace_prefix: tuple[str, ...],
        /,
        *,
        query: str | None = None,
        filter: dict[str, Any] | None = None,
        limit: int = 10,
        offset: int = 0,
        refresh_ttl: bool | None = None,
    ) -> list[SearchItem]:
        """Items under ``namespace_prefix`` matching ``filter``, ranked by ``query`` if given."""
        op = SearchOp(namespace_prefix, filter, limit, offset, query, self._refresh(refresh_ttl))
        return self.batch([op])[0]

    async def asearch(
        self,
        namespace_prefix: tuple[str, ...],
        /,
        *,
        query: str | None = None,
        filter: dict[str, Any] | None = None,
        limit: int = 10,
        offset: int = 0,
        refresh_ttl: bool | None = None,
    ) -> list[SearchItem]:
        """Items under ``namespace_prefix`` matching ``filter``, ranked by ``query`` if given."""
        op = SearchOp(namespace_prefix, filter, limit, offset, query, self._refresh(refresh_ttl))
        return (await self.abatch([op]))[0]

    def put(
        self,
        namespace: tuple[str, ...],
        key: str,
        value: Mapping[str, Any],
        index: Literal[False] | list[str] | None = None,
        *,
        ttl: float | NotProvided | None = NOT_PROVIDED,
    ) -> None:
        """Store ``value`` (a JSON object) at ``namespace``/``key``; ``ttl`` in minutes."""
        self.batch([PutOp(namespace, key, value, index, self._ttl(ttl))])

    async def aput(
        self,
        namespace: tuple[str, ...],
        key: str,
        value: Mapping[str, Any],
        index: Literal[False] | list[str] | None = None,
        *,
        ttl: float | NotProvided | None = NOT_PROVIDED,
    ) -> None:
        """Store ``value`` (a JSON object) at ``namespace``/``key``; ``ttl`` in minutes."""
        await self.abatch([PutOp(namespace, key, value, index, self._ttl(ttl))])

    def delete(self, namespace: tuple[str, ...], key: str) -> None:
        """Delete the item at ``namespace``/``key`` (nothing if there is none)."""
        self.batch([PutOp(namespace, key, None)])

    async def adelete(self, namespace: tuple[str, ...], key: str) -> None:
        """Delete the item at ``namespace``/``key`` (nothing if there is none)."""
        await self.abatch([PutOp(namespace, key, None)])

    def list_namespaces(
        self,
        *,
        prefix: Any = None,
        suffix: Any = None,
        max_depth: int | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[tuple[str, ...]]:
        """Namespaces holding items, matching ``prefix``/``suffix`` (``*``: any label),
        cut to ``max_depth`` labels, in tuple order."""
        return self.batch([self._listing(prefix, suffix, max_depth, limit, offset)])[0]

    async def alist_namespaces(
        self,
        *,
        prefix: Any = None,
        suffix: Any = None,
        max_depth: int | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[tuple[str, ...]]:
        """Namespaces holding items, matching ``prefix``/``suffix`` (``*``: any label),
        cut to ``max_depth`` labels, in tuple order."""
        return (await self.abatch([self._listing(prefix, suffix, max_depth, limit, offset)]))[0]

    def batch(self, ops: Iterable[Any]) -> list[Any]:
        """`abatch` from another thread than the store's event loop (`loop`)."""
        listed = list(ops)
        return run_sync(self._open_loop(), lambda: self.abatch(listed), "batch", type(self).__name__)

    def sweep_expired(self) -> int:
        """`asweep_expired` from another thread than the store's event loop (`loop`)."""
        return run_sync(self._open_loop(), self.asweep_expired, "sweep_expired", type(self).__name__)

    def _open_loop(self) -> asyncio.AbstractEventLoop:
        if self.loop is None:
            raise RuntimeError(self.closed_message)
        return self.loop

    async def abatch(self, ops: Iterable[Any]) -> list[Any]:  # pragma: no cover - backends override
        """Run ``ops`` in order (a backend implements it)."""
        raise NotImplementedError

    async def asweep_expired(self) -> int:  # pragma: no cover - backends override
        """Delete the items whose TTL has run out; return how many."""
        raise NotImplementedError
