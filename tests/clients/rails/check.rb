# Driven by tests/clients/test_rails.py: runs app.rb against the server in
# PGHOST, PGPORT, PGDATABASE, PGUSER and prints what happened as one JSON
# object; the test asserts on it.
# Usage: ruby check.rb migrate|create|insert_all|json
require "json"
require_relative "app"

ActiveRecord::Base.logger = nil
ActiveRecord::Migration.verbose = false
ActiveRecord::Base.establish_connection(
  adapter: "postgresql", host: ENV.fetch("PGHOST"), port: ENV.fetch("PGPORT"),
  database: ENV.fetch("PGDATABASE"), username: ENV.fetch("PGUSER")
)

# The SQL ActiveRecord sends, for the test to read.
SENT = []
ActiveSupport::Notifications.subscribe("sql.active_record") do |*, payload|
  SENT << payload[:sql] unless payload[:name] == "SCHEMA"
end

def conn
  ActiveRecord::Base.connection
end

out = {}
case ARGV.fetch(0)
when "migrate"
  CreateOrders.migrate(:up)
  out[:sql] = SENT.dup
  schema = StringIO.new
  ActiveRecord::SchemaDumper.dump(conn, schema)
  out[:schema_rb] = schema.string
when "create"
  before = Time.now
  order = Order.create!(item: "tea")
  after = Time.now
  out[:id] = order.id
  out[:id_class] = order.id.class.name
  out[:inserts] = SENT.grep(/INSERT/)
  out[:found_item] = Order.find(order.id).item
  out[:before_ms] = (before.to_f * 1000).floor
  out[:after_ms] = (after.to_f * 1000).ceil
  out[:worker_id] = conn.select_value("SELECT my_worker_id FROM snowflake_config()")
  second = Order.new(item: "coffee")
  second.save!
  out[:second_id] = second.id
when "insert_all"
  now = Time.now
  rows = (0...500).map { |i| { item: format("bulk %03d", i), created_at: now, updated_at: now } }
  result = Order.insert_all(rows, returning: %w[id item])
  out[:returned] = result.rows
  out[:inserts] = SENT.grep(/INSERT/).size
when "json"
  now = Time.now
  rows = (0...200).map { |i| { item: format("json %03d", i), created_at: now, updated_at: now } }
  Order.insert_all(rows)
  scope = ->(model) { model.where("item LIKE 'json %'").order(:id) }
  out[:db_ids] = conn.select_values("SELECT id::text FROM orders WHERE item LIKE 'json %' ORDER BY id")
  out[:plain_json] = scope.(Order).to_json
  out[:api_json] = scope.(ApiOrder).to_json
  out[:string_id_json] = scope.(StringIdOrder).to_json
  out[:as_json_id_class] = ApiOrder.find(out[:db_ids][0].to_i).as_json["id"].class.name
  # StringIdOrder: create returns a string key, find takes it.
  created = StringIdOrder.create!(item: "string id")
  out[:string_id_created] = created.id
  out[:string_id_found] = StringIdOrder.find(created.id).item
  out[:string_id_db] = conn.select_value("SELECT id::text FROM orders WHERE item = 'string id'")
else
  abort "usage: ruby check.rb migrate|create|insert_all|json"
end
puts JSON.generate(out)
