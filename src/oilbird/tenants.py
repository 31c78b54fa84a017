"""Per-tenant state of cross-request drafters: one generic container instead of a dict per drafter.

Contract:
- `TenantMap(factory)` holds one state object per tenant (a non-empty name chosen by the caller).
  `get(tenant)` builds it with `factory()` on first use; `peek(tenant)` never builds.
- `drop(tenant)` forgets the tenant at once. A request of that tenant still being served keeps
  the object it already holds and drafts from it to its end; what it commits lands in that
  orphaned object and is lost with it. Nothing re-creates the tenant before its next `get`.
- Every state object bounds itself: its config sets a cap in tokens, records or rows, and the
  object evicts in a documented order when an insert would pass it (see each drafter's module).
  The map bounds how long a tenant lives, not how big it is.
- `memory_bytes()` sums the states' own estimates (each state implements `memory_bytes()`), so
  a benchmark row can report what a drafter holds across requests.

`Drafter.drop_tenant` and `Drafter.memory_bytes` (drafters/base.py) cover every `TenantMap`
attribute of a drafter, so a drafter that keeps its cross-request state here gets both for free.
"""

from __future__ import annotations

from typing import Callable, Generic, Iterator, Protocol, TypeVar

from oilbird.errors import ConfigError


class Sized(Protocol):
    def memory_bytes(self) -> int: ...


T = TypeVar("T", bound=Sized)


class TenantMap(Generic[T]):
    """tenant name -> its state, built on first use by `factory` (see the module docstring).

    Args:
        factory: builds a fresh, empty state for a new tenant.
    """

    def __init__(self, factory: Callable[[], T]) -> None:
        self.factory = factory
        self._states: dict[str, T] = {}

    def get(self, tenant: str) -> T:
        """The state of `tenant`, built on first use.

        Raises:
            ConfigError: if the tenant name is empty or not a string.
        """
        if not isinstance(tenant, str) or not tenant:
            raise ConfigError(f"tenant name must be a non-empty string, got {tenant!r}")
        state = self._states.get(tenant)
        if state is None:
            state = self._states[tenant] = self.factory()
        return state

    def peek(self, tenant: str) -> T | None:
        """The state of `tenant`, or None when it has none (never builds one)."""
        return self._states.get(tenant)

    def drop(self, tenant: str) -> bool:
        """Forget `tenant`'s state; returns whether it had any."""
        return self._states.pop(tenant, None) is not None

    def tenants(self) -> list[str]:
        """Tenants with state, in order of first use."""
        return list(self._states)

    def __contains__(self, tenant: object) -> bool:
        return tenant in self._states

    def __len__(self) -> int:
        return len(self._states)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._states))

    def values(self) -> list[T]:
        return list(self._states.values())

    def memory_bytes(self) -> int:
        """Sum of the states' `memory_bytes()` estimates."""
        return sum(state.memory_bytes() for state in self._states.values())
