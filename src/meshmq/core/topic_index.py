"""Topic subscriptions indexed by the destinations they match.

Adding or removing a subscription and finding the subscriptions of a concrete topic
cost no more than the length of the name (plus the matches found), whatever the number
of subscriptions: one client with 100,000 subscriptions must not make every other
client wait. Patterns without wildcards sit in a dict by destination; wildcard patterns
in a tree of name segments, one per destination family (topic, temporary topic), where
``*`` is a child of its own and ``>`` (one or more trailing segments) a set on the node
it follows. Results come in subscription order and are cached per destination; a
change drops only the cache entries it can affect (every entry for a wildcard change,
which is cheap now that a lookup is).
"""

from __future__ import annotations

from typing import Final, Generic, Protocol, TypeVar

from meshmq.core.destinations import (
    ANY_CHILD,
    ANY_DESCENDANT,
    SEPARATOR,
    Destination,
    is_wildcard_name,
)


class _HasPatterns(Protocol):
    @property
    def patterns(self) -> tuple[Destination, ...]: ...


S = TypeVar("S", bound=_HasPatterns)

# Bounds memory when producers send to very many distinct topic names.
CACHE_LIMIT: Final = 10_000


class _Node(Generic[S]):
    __slots__ = ("children", "descendants", "here", "star")

    def __init__(self) -> None:
        self.children: dict[str, _Node[S]] = {}
        self.star: _Node[S] | None = None
        self.here: dict[S, None] = {}  # patterns that end at this node
        self.descendants: dict[S, None] = {}  # patterns with ">" right after this node

    def empty(self) -> bool:
        return not (self.children or self.star or self.here or self.descendants)


def _family(dest: Destination) -> tuple[bool, bool]:
    return dest.kind.is_queue, dest.kind.is_temporary


class TopicIndex(Generic[S]):
    def __init__(self) -> None:
        self._order: dict[S, int] = {}  # every subscription, with its insertion number
        self._next = 0
        self._exact: dict[Destination, dict[S, None]] = {}
        self._roots: dict[tuple[bool, bool], _Node[S]] = {}
        self._cache: dict[Destination, list[S]] = {}

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, sub: object) -> bool:
        return sub in self._order

    def all(self) -> list[S]:
        """Every subscription, oldest first."""
        return list(self._order)

    def add(self, sub: S) -> None:
        if sub in self._order:
            return
        self._order[sub] = self._next
        self._next += 1
        for pattern in set(sub.patterns):
            if is_wildcard_name(pattern.name):
                self._insert(pattern, sub)
                self._cache.clear()
            else:
                self._exact.setdefault(pattern, {})[sub] = None
                cached = self._cache.get(pattern)
                if cached is not None and (not cached or cached[-1] is not sub):
                    cached.append(sub)  # the newest subscription sorts last

    def discard(self, sub: S) -> None:
        if self._order.pop(sub, None) is None:
            return
        for pattern in set(sub.patterns):
            if is_wildcard_name(pattern.name):
                self._delete(pattern, sub)
                self._cache.clear()
            else:
                subs = self._exact.get(pattern)
                if subs is not None:
                    subs.pop(sub, None)
                    if not subs:
                        del self._exact[pattern]
                self._cache.pop(pattern, None)

    def match(self, dest: Destination) -> list[S]:
        """The subscriptions whose patterns cover ``dest``, oldest first."""
        found = self._cache.get(dest)
        if found is not None:
            return found
        exact = self._exact.get(dest)
        root = self._roots.get(_family(dest))
        if root is None:
            found = list(exact) if exact else []
        else:
            hits: dict[S, None] = dict(exact) if exact else {}
            _collect(root, dest.name.split(SEPARATOR), 0, hits)
            order = self._order
            found = sorted(hits, key=order.__getitem__) if len(hits) > 1 else list(hits)
        if len(self._cache) >= CACHE_LIMIT:
            self._cache.clear()
        self._cache[dest] = found
        return found

    def _insert(self, pattern: Destination, sub: S) -> None:
        node = self._roots.get(_family(pattern))
        if node is None:
            node = self._roots[_family(pattern)] = _Node()
        for segment in pattern.name.split(SEPARATOR):
            if segment == ANY_DESCENDANT:
                node.descendants[sub] = None
                return
            if segment == ANY_CHILD:
                if node.star is None:
                    node.star = _Node()
                node = node.star
            else:
                child = node.children.get(segment)
                if child is None:
                    child = node.children[segment] = _Node()
                node = child
        node.here[sub] = None

    def _delete(self, pattern: Destination, sub: S) -> None:
        family = _family(pattern)
        root = self._roots.get(family)
        if root is None:
            return
        path: list[tuple[_Node[S], str]] = []  # (parent, segment) down to the last node
        node = root
        for segment in pattern.name.split(SEPARATOR):
            if segment == ANY_DESCENDANT:
                node.descendants.pop(sub, None)
                break
            nxt = node.star if segment == ANY_CHILD else node.children.get(segment)
            if nxt is None:
                return
            path.append((node, segment))
            node = nxt
        else:
            node.here.pop(sub, None)
        # Prune the branch nodes this pattern leaves empty.
        while path and node.empty():
            parent, segment = path.pop()
            if segment == ANY_CHILD:
                parent.star = None
            else:
                del parent.children[segment]
            node = parent
        if root.empty():
            del self._roots[family]


def _collect(node: _Node[S], segments: list[str], i: int, hits: dict[S, None]) -> None:
    if i == len(segments):
        hits.update(node.here)
        return
    hits.update(node.descendants)  # ">" needs at least one more segment: there is one
    child = node.children.get(segments[i])
    if child is not None:
        _collect(child, segments, i + 1, hits)
    if node.star is not None:
        _collect(node.star, segments, i + 1, hits)
