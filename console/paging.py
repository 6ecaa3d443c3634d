"""Paging whose cost does not grow with the table: the count behind the pager stops at
``COUNT_CAP`` (a COUNT over every visible job costs the whole table; its first 10,001 rows do not)."""
from __future__ import annotations

from django.core.paginator import Page, Paginator
from django.db.models import QuerySet
from django.utils.functional import cached_property

COUNT_CAP = 10_000


def capped_count(queryset: QuerySet) -> int:
    """The number of rows, exact up to ``COUNT_CAP``; ``COUNT_CAP + 1`` means "more"."""
    return queryset.order_by().values("pk")[: COUNT_CAP + 1].count()


class CappedPaginator(Paginator):
    """A Paginator whose ``count`` is ``capped_count``: past the cap the pager offers the first
    10,000 rows' pages and says there are more (filters and sorting reach the others)."""

    @cached_property
    def count(self) -> int:
        return capped_count(self.object_list)  # type: ignore[arg-type]  # a QuerySet here, always

    @property
    def capped(self) -> bool:
        return self.count > COUNT_CAP

    def page(self, number: int | str) -> Page:
        number = self.validate_number(number)
        bottom = (number - 1) * self.per_page
        top = bottom + self.per_page
        # Past the cap the count is not the end: the last page is a full page, not cut at the cap.
        if not self.capped and top + self.orphans >= self.count:
            top = self.count
        return Page(self.object_list[bottom:top], number, self)
