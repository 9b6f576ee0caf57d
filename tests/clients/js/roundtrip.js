// Run by tests/clients/test_js.py against a real server; prints one JSON
// object of findings. Uses ids.js (quoted by docs/guides/clients.md) for
// the recommended way and shows what goes wrong with the others.
const { pool, insertOrder, findOrder, orderJson } = require("./ids");

async function main() {
  const out = {};
  await pool.query("DROP TABLE IF EXISTS orders");
  await pool.query(
    "CREATE TABLE orders (id bigint PRIMARY KEY DEFAULT snowflake_nextval(), item text)");
  // The recommended way: strings end to end.
  const one = await insertOrder("tea");
  out.returned_type = typeof one;
  const found = await findOrder(one);
  out.string_roundtrip = found.id === one && found.item === "tea";
  out.json_doc = await orderJson(one);
  out.json_doc_exact = JSON.parse(JSON.stringify(out.json_doc)).id === one;

  // 2,000 IDs made in one statement by one backend.
  const { rows } = await pool.query(
    "INSERT INTO orders (item) SELECT 'item ' || g FROM generate_series(1, 2000) g " +
    "RETURNING id, id::text AS text_id, item");
  out.count = rows.length;
  out.strings_exact = rows.filter((r) => r.id === r.text_id).length;
  // The pitfall: parsing them as Number.
  out.changed_by_number = rows.filter((r) => String(Number(r.id)) !== r.id).length;
  // A lookup by the Number-parsed ID: how often it finds another row.
  let wrongRow = 0;
  let missing = 0;
  for (const r of rows.slice(0, 200)) {
    const got = await findOrder(String(Number(r.id)));
    if (!got) missing += 1;
    else if (got.item !== r.item) wrongRow += 1;
  }
  out.number_lookup_wrong_row = wrongRow;
  out.number_lookup_missing = missing;
  // json_build_object('id', id) makes a JSON number: precision lost in JSON.parse.
  const { rows: docs } = await pool.query(
    "SELECT id::text AS text_id, json_build_object('id', id) AS doc FROM orders");
  out.json_number_changed = docs.filter((d) => String(d.doc.id) !== d.text_id).length;
  // A BigInt parser for int8 is exact, but JSON.stringify then throws.
  const types = require("pg").types;
  types.setTypeParser(20, BigInt);
  const { rows: big } = await pool.query("SELECT id, id::text AS text_id FROM orders");
  out.bigint_exact = big.filter((r) => r.id.toString() === r.text_id).length;
  try {
    JSON.stringify(big[0]);
    out.bigint_json = "ok";
  } catch (e) {
    out.bigint_json = e.constructor.name + ": " + e.message;
  }
  types.setTypeParser(20, (v) => v);
  const { rows: mx } = await pool.query("SELECT max(id)::text AS m FROM orders");
  out.max_id = mx[0].m;
  out.max_safe = Number.MAX_SAFE_INTEGER.toString();
  await pool.end();
  console.log(JSON.stringify(out));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
