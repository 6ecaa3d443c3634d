"""Paging whose cost does not grow with the table.

* The count behind the pager stops at ``COUNT_CAP`` (a COUNT over every visible job costs the whole
  table; its first 10,001 rows do not).
* A page is read from each access branch's own first rows (``list_branches``, ``rows_between``):
  "owner = me OR project IN (mine)" ordered by date matches no single index, so the database
  gathers every visible job and sorts them all to return 20. Each branch alone (my jobs; one
  project's jobs; times one status when filtered) is an index range in the list's order, so its
  first N rows cost N, and the page is sorted from those few.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from django.core.paginator import Page, Paginator
from django.db import connections
from django.db.models import Q, QuerySet
from django.db.models.expressions import RawSQL
from django.utils.functional import cached_property

from jobs.models import Project

COUNT_CAP = 10_000
# A user in more projects than this (or a status filter that multiplies them past it) gets the
# plain query: one subquery per branch stops paying off.
MAX_BRANCHES = 64


def capped_count(queryset: QuerySet, parts: list[Q] | None = None) -> int:
    """The number of rows, exact up to ``COUNT_CAP``; ``COUNT_CAP + 1`` means "more". With
    ``parts`` (``ListBranches.counts``) the parts are counted off their own indexes: one query on
    PostgreSQL, one per part on SQLite."""
    if not parts:
        return queryset.order_by().values("pk")[: COUNT_CAP + 1].count()
    if connections[queryset.db].features.supports_slicing_ordering_in_compound:
        # PostgreSQL, one query: the union of each part's first COUNT_CAP + 1 rows holds more
        # than COUNT_CAP rows exactly when the whole does.
        capped = [queryset.filter(part).order_by().values("pk")[: COUNT_CAP + 1] for part in parts]
        return min(capped[0].union(*capped[1:]).count(), COUNT_CAP + 1)
    # SQLite, one query per part and no union (a union of 20,000 ids cost 15 ms): the projects'
    # parts are disjoint (a job is in one project), so the whole is their sizes plus the own jobs
    # in none of them, each counted off its index alone (jobs.models' job_*_created). The
    # projects' go first: past the cap the count stops there. Else the own jobs inside them are
    # at most the cap, so the last count reads at most twice the cap (it skips those).
    own, projects = parts[0], parts[1:]
    outside = Q()
    for project in projects:
        outside &= ~project
    total = 0
    for part in (*projects, own & outside):
        total += capped_count(queryset.filter(part))
        if total > COUNT_CAP:
            return COUNT_CAP + 1
    return total


@dataclass(frozen=True)
class ListBranches:
    """Parts whose union holds every job ``TrainingJob.objects.visible_to(user)`` may list. They
    only narrow a queryset already scoped by ``visible_to``: they grant nothing.

    ``rows``: each an index range in the list's order (jobs.models' ``job_*_created`` indexes), for
    reading a page (``rows_between``). ``counts``: the access parts, own jobs first, then each
    project's (``Q(project=pk)``, disjoint), for counting the list (``capped_count``): one count
    over "owner OR project" reads other users' jobs (every job of a filtered status on SQLite; a
    scan on PostgreSQL for a user with few jobs)."""

    rows: list[Q] = field(default_factory=list)
    counts: list[Q] = field(default_factory=list)
    # ``rows`` as (parts, statuses) where it is every part times every status: SQLite's page then
    # compiles one subquery per part, not per branch (``rows_between``).
    product: tuple[list[Q], list[str]] | None = None


def list_branches(user, statuses: Iterable[str] = ()) -> ListBranches:
    """The branches of ``user``'s list filtered to ``statuses`` (none: any status). Empty where one
    index already serves the plain query (staff, no status filter) or a user is in too many
    projects for one subquery each to pay off."""
    if user.is_staff:
        parts = [Q()]
    else:
        projects = Project.objects.filter(members=user).order_by("pk").values_list("pk", flat=True)
        parts = [Q(owner=user), *(Q(project=pk) for pk in projects[: MAX_BRANCHES + 1])]
    wanted = sorted(set(statuses))
    rows = [part & Q(status=status) for part in parts for status in wanted] if wanted else parts
    if rows == [Q()] or len(rows) > MAX_BRANCHES:
        rows = []
    # SQLite counts the parts one query each, so only where the plain count reads other users' jobs
    # (a status filter); PostgreSQL counts them in one query, and also scans for the plain one.
    postgres = connections[Project.objects.db].features.supports_slicing_ordering_in_compound
    counts = parts if (wanted or postgres) and 1 < len(parts) <= MAX_BRANCHES else []
    product = (parts, wanted) if rows and len(wanted) > 1 else None
    return ListBranches(rows=rows, counts=counts, product=product)


def rows_between(
    queryset: QuerySet,
    branches: list[Q],
    bottom: int,
    top: int,
    rows: Callable[[Any], QuerySet] = lambda rows: rows,
    product: tuple[list[Q], list[str]] | None = None,
) -> QuerySet:
    """``queryset[bottom:top]``, read from each branch's own first ``top`` rows in the queryset's
    order (``top`` rows off its index each): every one of the first ``top`` rows overall is among
    its branch's first ``top``, so the rows and their order are the same, and the database sorts at
    most ``len(branches) * top`` ids, not every visible job. The rows themselves are then fetched
    by id alone, so no index of the filters competes with the ids, and through ``rows`` (what the
    page shows beyond the jobs' own columns: annotations, joined rows), which the branches' id
    subqueries, built once per branch, do without (ten of them built from the annotated queryset
    cost 25 ms a page)."""
    if len(branches) < 2 or top <= bottom:
        return rows(queryset.filter(branches[0]) if len(branches) == 1 else queryset)[bottom:top]
    ordering = queryset.query.order_by or queryset.model._meta.ordering
    if connections[queryset.db].features.supports_slicing_ordering_in_compound:
        # PostgreSQL: "id IN (a UNION b …)", each part its branch's first ids. It plans
        # "id IN (a) OR id IN (b)" as a walk down the date index testing each row against both,
        # which reads the whole table for a user whose jobs are old.
        each = [queryset.filter(branch).order_by(*ordering).values("pk")[:top] for branch in branches]
        return rows(queryset.filter(pk__in=each[0].union(*each[1:])))[bottom:top]
    firsts = Q()
    compiled = product and branches_sql(queryset, *product, ordering, top)
    if compiled:
        firsts = Q(pk__in=RawSQL(*compiled))
    else:
        for branch in branches:
            firsts |= Q(pk__in=queryset.filter(branch).order_by(*ordering).values("pk")[:top])
    ids = queryset.model._base_manager.filter(firsts).order_by(*ordering).values("pk")[bottom:top]
    return rows(queryset.filter(pk__in=ids))


STATUS_SLOT = "\x00status\x00"  # no status holds a NUL (nor does any filter: forms refuse it)


def branches_sql(queryset: QuerySet, parts: list[Q], statuses: list[str], ordering, top: int) -> tuple[str, list] | None:
    """Every part's first ``top`` ids of each status, as one SQL compound ("… UNION ALL …") and
    its parameters: each part's subquery is compiled once with its status as a parameter, then
    repeated with each status in that slot (the ORM took ~1.7 ms a branch: ten branches, five
    statuses of two parts, cost 17 ms a page). None where the slot is not one parameter."""
    pieces: list[str] = []
    params: list = []
    for part in parts:
        branch = queryset.filter(part, status=STATUS_SLOT).order_by(*ordering).values("pk")[:top]
        sql, compiled = branch.query.get_compiler(using=queryset.db).as_sql()
        slots = [i for i, value in enumerate(compiled) if value == STATUS_SLOT]
        if len(slots) != 1:
            return None
        for status in statuses:
            values = list(compiled)
            values[slots[0]] = status
            pieces.append(f"SELECT * FROM ({sql})")
            params += values
    return " UNION ALL ".join(pieces), params


class CappedPaginator(Paginator):
    """A Paginator whose ``count`` is ``capped_count``: past the cap the pager offers the first
    10,000 rows' pages and says there are more (filters and sorting reach the others). With
    ``branches`` (``list_branches``) a page reads only its branches' first rows."""

    def __init__(
        self,
        object_list: QuerySet,
        per_page: int,
        *,
        branches: ListBranches | None = None,
        rows: Callable[[Any], QuerySet] = lambda rows: rows,
        **kwargs,
    ) -> None:
        super().__init__(object_list, per_page, **kwargs)
        self.branches = branches or ListBranches()
        self.rows = rows  # what a page's rows are read with (``rows_between``)

    @cached_property
    def count(self) -> int:
        return capped_count(self.object_list, self.branches.counts)  # type: ignore[arg-type]  # a QuerySet here, always

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
        found = rows_between(self.object_list, self.branches.rows, bottom, top, self.rows, self.branches.product)  # type: ignore[arg-type]
        return Page(found, number, self)
