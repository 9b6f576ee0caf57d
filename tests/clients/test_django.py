"""Django (the version tests/clients/requirements.txt pins) against a real
server: the recipe in tests/clients/django_app (quoted by
docs/guides/clients.md) makes
keys with snowflake_nextval() through db_default, read back with RETURNING.

Covers create, save, get_or_create, a foreign key, bulk_create, and Django
5.2's bulk_create-then-save double insert (ticket 36260)."""
from __future__ import annotations

import os

import pytest

from clients.support import HERE, doc_blocks, require_clients, module_server

DB = "shop"


@pytest.fixture(scope="module")
def server(request):
    require_clients()
    yield from module_server(request)


@pytest.fixture(scope="module")
def django_db(server):
    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure(
            INSTALLED_APPS=["clients.django_app"],
            DATABASES={"default": {
                "ENGINE": "django.db.backends.postgresql", "NAME": DB,
                "HOST": server.dir, "PORT": str(server.port), "USER": "postgres",
            }},
            USE_TZ=True,
        )
        django.setup()
    server.create_db(DB)  # without the extension: the migration creates it
    from django.core.management import call_command
    from django.db import connection
    call_command("migrate", "shop", verbosity=0)
    yield connection
    connection.close()


def test_migration_creates_the_extension_and_the_defaults(server, django_db):
    assert server.scalar("SELECT count(*) FROM pg_extension WHERE extname = 'snowflake_id'",
                         dbname=DB) == 1
    defaults = server.sql(
        "SELECT c.relname, pg_get_expr(d.adbin, d.adrelid) FROM pg_attrdef d "
        "JOIN pg_class c ON c.oid = d.adrelid WHERE c.relname LIKE 'shop\\_%' ORDER BY 1",
        dbname=DB)
    assert defaults == [("shop_customer", "snowflake_nextval()"),
                        ("shop_order", "snowflake_nextval()")]


def test_create_save_get_or_create_and_foreign_key(server, django_db):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from clients.django_app.models import Customer, Order

    with CaptureQueriesContext(connection) as q:
        ada = Customer.objects.create(name="ada")
    # The key comes back from the INSERT itself: one round trip.
    assert len(q.captured_queries) == 1, q.captured_queries
    assert 'RETURNING "shop_customer"."id"' in q.captured_queries[0]["sql"]
    assert isinstance(ada.pk, int) and ada.pk > 2**40
    assert server.scalar("SELECT snowflake_worker_id(%s) IS NOT NULL", ada.pk, dbname=DB)

    grace = Customer(name="grace")
    grace.save()
    assert isinstance(grace.pk, int) and grace.pk > ada.pk
    grace.name = "grace hopper"
    grace.save()  # an UPDATE of the same row, not a second row
    assert Customer.objects.count() == 2
    assert Customer.objects.get(pk=grace.pk).name == "grace hopper"

    again, created = Customer.objects.get_or_create(name="ada")
    assert not created and again.pk == ada.pk
    alan, created = Customer.objects.get_or_create(name="alan")
    assert created and alan.pk > grace.pk

    order = Order.objects.create(customer=ada, item="coffee")
    assert order.pk > alan.pk and order.customer_id == ada.pk
    assert Order.objects.select_related("customer").get(pk=order.pk).customer.name == "ada"
    assert list(ada.order_set.values_list("item", flat=True)) == ["coffee"]


def test_bulk_create_then_save_double_insert_trap(server, django_db):
    """Django 5.2: bulk_create() does not set pk from a db_default (it stays
    a DatabaseDefault object), and a later save() inserts a second row
    (ticket 36260, fixed in Django 6.0). The recipe's workaround below."""
    import django
    from django.db.models.expressions import DatabaseDefault
    from clients.django_app.models import Customer, Order

    ada = Customer.objects.get(name="ada")
    objs = Order.objects.bulk_create([Order(customer=ada, item=f"bulk {i}") for i in range(3)])
    assert Order.objects.filter(item__startswith="bulk ").count() == 3
    if django.VERSION < (6, 0):
        assert isinstance(objs[0].pk, DatabaseDefault), objs[0].pk
        objs[0].item = "bulk 0 changed"
        objs[0].save()  # meant as an UPDATE ...
        # ... but it inserted a second row.
        assert Order.objects.filter(item__startswith="bulk ").count() == 4, "the trap is gone"
    else:
        assert all(isinstance(o.pk, int) for o in objs)


def test_bulk_create_recipe_assigns_keys_first(server, django_db):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from clients.django_app.models import Customer, Order
    from clients.django_app.bulk import bulk_create_with_keys

    ada = Customer.objects.get(name="ada")
    with CaptureQueriesContext(connection) as q:
        orders = bulk_create_with_keys(Order, [Order(customer=ada, item=f"tea {i}")
                                               for i in range(500)])
    # One query for the keys, one INSERT for the rows (plus BEGIN/COMMIT).
    sent = [x["sql"] for x in q.captured_queries if x["sql"] not in ("BEGIN", "COMMIT")]
    assert len(sent) == 2, [x[:80] for x in sent]
    assert sent[0] == "SELECT snowflake_nextvals(500)" and sent[1].startswith("INSERT")
    pks = [o.pk for o in orders]
    assert all(isinstance(pk, int) for pk in pks) and pks == sorted(pks)
    assert len(set(pks)) == 500
    orders[0].item = "green tea"
    orders[0].save()  # an UPDATE: no second row
    assert Order.objects.filter(item__startswith="tea ").count() == 499
    assert Order.objects.get(pk=pks[0]).item == "green tea"
    assert server.scalar("SELECT count(*) FROM shop_order WHERE item LIKE '%%tea%%'",
                         dbname=DB) == 500


def test_readme_quotes_the_django_recipe():
    for name in ("models.py", "bulk.py", "migrations/0001_snowflake_id.py"):
        text = open(os.path.join(HERE, "django_app", name)).read().strip()
        blocks = doc_blocks("docs/guides/clients.md", "python")
        assert text in blocks, \
            f"docs/guides/clients.md does not quote tests/clients/django_app/{name} verbatim"
