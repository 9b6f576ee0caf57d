from django.db import connection


def bulk_create_with_keys(model, objs, **kwargs):
    """bulk_create() with the keys taken first from snowflake_nextvals(), in
    one round trip: Django 5.2 does not set pk from a db_default in
    bulk_create(), and a later save() would insert a second row."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT snowflake_nextvals(%s)", [len(objs)])
        for obj, (key,) in zip(objs, cursor.fetchall()):
            obj.pk = key
    return model.objects.bulk_create(objs, **kwargs)
