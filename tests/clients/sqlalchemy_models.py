from sqlalchemy import BigInteger, ForeignKey, String, insert_sentinel, text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


def snowflake_pk():
    # autoincrement=False: with True, create_all() makes the column BIGSERIAL
    # and ignores the server default (IDs 1, 2, 3 ...).
    return mapped_column(BigInteger, primary_key=True, autoincrement=False,
                         server_default=text("snowflake_nextval()"))


class Customer(Base):
    __tablename__ = "customers"
    id: Mapped[int] = snowflake_pk()
    name: Mapped[str] = mapped_column(String(100))
    # Lets the ORM flush many new objects in one INSERT ... RETURNING and
    # match the returned keys to them.
    _sentinel: Mapped[int] = insert_sentinel()


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[int] = snowflake_pk()
    customer_id: Mapped[int] = mapped_column(ForeignKey("customers.id"))
    item: Mapped[str] = mapped_column(String(100))
    _sentinel: Mapped[int] = insert_sentinel()
