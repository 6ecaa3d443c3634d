"""One statement for many rows, each with its own value: ``UPDATE … SET col = CASE pk WHEN …``.

Written out by hand because Django's ``Case(When(pk=…))`` costs about a millisecond per row to
build, which at a placement round of hundreds of jobs is most of the round. Plain SQL that
SQLite and PostgreSQL both run; every value is a bound parameter.
"""

from __future__ import annotations

from typing import Any, cast

from django.db import connection, models


def update_each(model: type[models.Model], field: str, values: dict[int, Any], *, where: dict[str, Any] | None = None) -> int:
    """Set ``field`` of each row ``pk`` in ``values`` to its value, only where every column in
    ``where`` equals its value (``None``: IS NULL): a compare-and-swap for many rows in one
    statement. Returns the number of rows changed."""
    if not values:
        return 0
    meta = model._meta
    quote = connection.ops.quote_name
    pk = quote(column_of(meta.pk))
    target = cast(models.Field, meta.get_field(field))
    cases = " ".join("WHEN %s THEN %s" for _ in values)
    params: list[Any] = []
    for key, value in values.items():
        params += [key, target.get_db_prep_save(value, connection)]
    conditions = [f"{pk} IN ({', '.join(['%s'] * len(values))})"]
    params += list(values)
    for name, expected in (where or {}).items():
        column = quote(column_of(meta.get_field(name)))
        if expected is None:
            conditions.append(f"{column} IS NULL")
        else:
            conditions.append(f"{column} = %s")
            params.append(expected)
    sql = f"UPDATE {quote(meta.db_table)} SET {quote(column_of(target))} = CASE {pk} {cases} END WHERE {' AND '.join(conditions)}"
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


def column_of(field: object) -> str:
    """The database column of a concrete model field."""
    assert isinstance(field, models.Field) and field.column, field
    return field.column
