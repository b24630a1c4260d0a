"""One page of a long list (a deck's or a topic's cards): which page the URL asks for, and what the
pager shows. A 100,000-card deck rendered whole was 22 MB and 5 s a request."""

from __future__ import annotations

from dataclasses import dataclass

from flask import abort, request

PAGE_SIZE = 100


@dataclass(frozen=True)
class Page:
    """Page `number` (from 1) of `total` items, `size` a page."""

    number: int
    total: int
    size: int = PAGE_SIZE

    @property
    def count(self) -> int:
        """Pages in all; an empty list is one empty page."""
        return max(1, -(-self.total // self.size))

    @property
    def offset(self) -> int:
        return (self.number - 1) * self.size

    @property
    def first_shown(self) -> int:
        """The 1-based position of the page's first item (0 on an empty list)."""
        return min(self.offset + 1, self.total)

    @property
    def last_shown(self) -> int:
        return min(self.offset + self.size, self.total)

    def slice(self, items: list) -> list:
        return items[self.offset:self.offset + self.size]


def requested_page(total: int, size: int = PAGE_SIZE) -> Page:
    """The page the query's `page` asks for (default 1): a 400 naming it unless it is a whole number
    from 1, a 404 past the last page."""
    raw = request.args.get("page", "1").strip()
    if not raw.isascii() or not raw.isdigit() or len(raw) > 9 or int(raw) < 1:
        abort(400, description=f"page must be a whole number from 1, got {raw[:40]!r}.")
    page = Page(int(raw), total, size)
    if page.number > page.count:
        abort(404, description=f"There is no page {page.number}: there are {page.count:,}.")
    return page
