require "active_record"

# db/migrate/20240101000000_create_orders.rb: the key defaults to
# snowflake_nextval() (a bigint, no sequence). schema.rb keeps the default.
class CreateOrders < ActiveRecord::Migration[6.1]
  def change
    enable_extension "snowflake_id" # needs a superuser; or create it beforehand
    create_table :orders, id: :bigint, default: -> { "snowflake_nextval()" } do |t|
      t.string :item, null: false
      t.timestamps
    end
  end
end

class ApplicationRecord < ActiveRecord::Base
  self.abstract_class = true
end

# create reads the new key back with INSERT ... RETURNING "id".
class Order < ApplicationRecord
end

# For JSON that JavaScript reads, under the classic layout: a JavaScript
# number holds integers exactly only up to 2^53, so send IDs (and foreign
# keys ending in _id) as strings. Under the js53 layout the IDs are below
# 2^53 and plain numbers are exact.
module SnowflakeIdsAsStrings
  def serializable_hash(options = nil)
    super.to_h do |name, value|
      id = name == "id" || name.end_with?("_id")
      [name, id && value.is_a?(Integer) ? value.to_s : value]
    end
  end
end

class ApiOrder < ApplicationRecord
  self.table_name = "orders"
  include SnowflakeIdsAsStrings
end

# Or make the attribute itself a string: as_json and to_json give strings,
# and find / where take the string.
class StringIdOrder < ApplicationRecord
  self.table_name = "orders"
  attribute :id, :string
end
