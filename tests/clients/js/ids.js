// Snowflake IDs in node-postgres: keep them as strings end to end.
const { Pool } = require("pg");

const pool = new Pool(); // PGHOST, PGPORT, PGUSER, PGDATABASE from the environment

// int8 arrives as a string by default: exact. Send it back as a string too.
async function insertOrder(item) {
  const { rows } = await pool.query(
    "INSERT INTO orders (item) VALUES ($1) RETURNING id", [item]);
  return rows[0].id; // e.g. '386258421040152576'
}

async function findOrder(id) {
  const { rows } = await pool.query("SELECT id, item FROM orders WHERE id = $1", [id]);
  return rows[0];
}

// JSON built in SQL: make the ID a JSON string, or it loses precision in
// JSON.parse (json_build_object('id', id) gives a JSON number).
async function orderJson(id) {
  const { rows } = await pool.query(
    "SELECT jsonb_build_object('id', to_jsonb(id::text), 'item', item) AS doc " +
    "FROM orders WHERE id = $1", [id]);
  return rows[0].doc; // { id: '386258421040152576', item: 'tea' }
}

module.exports = { pool, insertOrder, findOrder, orderJson };
