"""SQLAlchemy 2 (pinned in tests/clients/requirements.txt) with psycopg 3,
and asyncpg, against a real server. The declarations are
tests/clients/sqlalchemy_models.py, which docs/guides/clients.md quotes."""
import asyncio
import os

import pytest

from clients.support import HERE, doc_blocks, require_clients, module_server


@pytest.fixture(scope="module")
def server(request):
    require_clients()
    yield from module_server(request)


def engine_for(server, dbname):
    from sqlalchemy import create_engine
    return create_engine(f"postgresql+psycopg://postgres@/{dbname}?host={server.dir}"
                         f"&port={server.port}")


def count_inserts(engine):
    from sqlalchemy import event
    seen = []

    @event.listens_for(engine, "before_cursor_execute")
    def _record(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("INSERT"):
            seen.append(statement)
    return seen


def test_server_default_with_returning_and_batched_flush(server):
    from sqlalchemy import select
    from sqlalchemy.orm import Session
    from clients.sqlalchemy_models import Base, Customer, Order

    server.create_db("sa")
    server.create_extension(dbname="sa")
    engine = engine_for(server, "sa")
    Base.metadata.create_all(engine)
    assert server.sql("SELECT table_name, data_type, column_default FROM information_schema.columns "
                      "WHERE column_name = 'id' ORDER BY 1", dbname="sa") == [
        ("customers", "bigint", "snowflake_nextval()"),
        ("orders", "bigint", "snowflake_nextval()")]
    inserts = count_inserts(engine)
    with Session(engine) as session:
        ada = Customer(name="ada")
        session.add(ada)
        session.flush()
        # The key is read back from the INSERT (RETURNING), no extra query.
        assert len(inserts) == 1 and "RETURNING customers.id" in inserts[0]
        assert ada.id > 2**40
        inserts.clear()
        customers = [Customer(name=f"c{i}") for i in range(200)]
        session.add_all(customers)
        session.flush()
        # insert_sentinel(): the 200 objects go in one batched INSERT.
        assert len(inserts) == 1, len(inserts)
        ids = [c.id for c in customers]
        assert len(set(ids)) == 200 and all(i > ada.id for i in ids)
        # Each object got its own row's key.
        names = dict(session.execute(select(Customer.id, Customer.name)).all())
        assert all(names[c.id] == c.name for c in customers)
        session.add_all([Order(customer_id=c.id, item="tea") for c in customers[:10]])
        session.commit()
    assert server.scalar("SELECT count(*) FROM orders o JOIN customers c ON c.id = o.customer_id",
                         dbname="sa") == 10
    engine.dispose()


def test_without_sentinel_the_flush_is_one_insert_per_object(server):
    from sqlalchemy import BigInteger, String, text
    from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

    class Base(DeclarativeBase):
        pass

    class Plain(Base):
        __tablename__ = "plain"
        id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False,
                                        server_default=text("snowflake_nextval()"))
        name: Mapped[str] = mapped_column(String(100))

    server.create_db("sa_plain")
    server.create_extension(dbname="sa_plain")
    engine = engine_for(server, "sa_plain")
    Base.metadata.create_all(engine)
    inserts = count_inserts(engine)
    with Session(engine) as session:
        objs = [Plain(name=f"p{i}") for i in range(20)]
        session.add_all(objs)
        session.commit()
        assert len(inserts) == 20
        assert len({o.id for o in objs}) == 20
    engine.dispose()


def test_autoincrement_true_silently_makes_a_bigserial(server):
    from sqlalchemy import BigInteger, String, text
    from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

    class Base(DeclarativeBase):
        pass

    class Wrong(Base):
        __tablename__ = "wrong"
        id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True,
                                        server_default=text("snowflake_nextval()"))
        name: Mapped[str] = mapped_column(String(100))

    server.create_db("sa_wrong")
    server.create_extension(dbname="sa_wrong")
    engine = engine_for(server, "sa_wrong")
    Base.metadata.create_all(engine)
    with Session(engine) as session:
        objs = [Wrong(name=f"w{i}") for i in range(3)]
        session.add_all(objs)
        session.commit()
        assert [o.id for o in objs] == [1, 2, 3]
    assert server.scalar("SELECT column_default FROM information_schema.columns "
                         "WHERE table_name = 'wrong' AND column_name = 'id'",
                         dbname="sa_wrong") == "nextval('wrong_id_seq'::regclass)"
    engine.dispose()


def test_asyncpg_pool_returns_exact_ids(server):
    import asyncpg

    async def main():
        pool = await asyncpg.create_pool(host=server.dir, port=server.port, user="postgres",
                                         database="postgres", min_size=4, max_size=4)
        await pool.execute("CREATE TABLE apg (id bigint PRIMARY KEY DEFAULT snowflake_nextval(), "
                           "n int)")

        async def insert(n):
            return await pool.fetchval("INSERT INTO apg (n) VALUES ($1) RETURNING id", n)
        ids = await asyncio.gather(*(insert(n) for n in range(400)))
        batch = await pool.fetch("INSERT INTO apg (n) SELECT g FROM generate_series(1, 100) g "
                                 "RETURNING id, (snowflake_decode(id)).worker_id")
        text_ids = await pool.fetch("SELECT id, id::text AS t FROM apg")
        workers = await pool.fetchval("SELECT count(DISTINCT snowflake_worker_id(id)) FROM apg")
        await pool.close()
        return ids, batch, text_ids, workers

    ids, batch, text_ids, workers = asyncio.run(main())
    assert len(set(ids)) == 400 and all(isinstance(i, int) for i in ids)
    assert len(batch) == 100 and all(r["worker_id"] is not None for r in batch)
    # asyncpg decodes int8 to Python int: exact, whatever its size.
    assert all(str(r["id"]) == r["t"] for r in text_ids)
    # Four pooled connections: at most four worker ids.
    assert 1 <= workers <= 4


def test_readme_quotes_the_sqlalchemy_models():
    text = open(os.path.join(HERE, "sqlalchemy_models.py")).read().strip()
    blocks = doc_blocks("docs/guides/clients.md", "python")
    assert text in blocks, \
        "docs/guides/clients.md does not quote tests/clients/sqlalchemy_models.py verbatim"
