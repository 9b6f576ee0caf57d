CREATE TABLE orders (
    id         bigint PRIMARY KEY DEFAULT snowflake_nextval(),
    item       text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
